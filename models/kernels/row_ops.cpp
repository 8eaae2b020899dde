// Row-wise float32 ops of a prefill chunk, for x86 CPUs with AVX2 and FMA (built into the same
// library as vnni_kernels.cpp; registered as MINIPD_OPS::rms_norm and MINIPD_OPS::silu_mul).
//
// Why: around the int8 matmuls a float32 prefill layer ran ~25 torch ops, ~8% of a 512-token
// SmolLM2 chunk on one core; torch's float32 rms_norm alone is six (pow, mean, add, rsqrt, two
// muls), each a pass over the rows. Here each is one pass. Both are row-wise: a row's result
// depends on that row only (its sums in a fixed order), so on no chunking or batch.
//   rms_norm(x [T, H], w [H], eps) = w * (x / sqrt(mean(x^2) + eps))   (H a multiple of 8)
//   silu_mul(gate_up [T, 2F])      = silu(gate_up[:, :F]) * gate_up[:, F:]   (F a multiple of 8)
// silu(g) = g / (1 + e^-g), e^x by Cephes' polynomial (within 2 ulp of expf); within float32
// rounding of torch's ops, not bit-equal to them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#include "avx2_math.h"

#ifndef MINIPD_OPS
#error "build with -DMINIPD_OPS=<the ops' namespace> (vnni_kernels.py does)"
#endif

namespace {
using namespace minipd_avx2_math;

void check_rows(const at::Tensor& x, const char* what, int64_t multiple) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "minipd ", what, ": x must be a float32 CPU tensor [rows, features] with contiguous rows");
  TORCH_CHECK(x.size(1) % multiple == 0, "minipd ", what, ": features must be a multiple of ", multiple, ", got ",
              x.size(1));
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "rms_norm", 8);
  const int64_t rows = x.size(0), H = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == H,
              "minipd rms_norm: weight must be a contiguous float32 tensor of ", H, " values");
  at::Tensor out = at::empty({rows, H}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const float* w = weight.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * stride;
      __m256 sq = _mm256_setzero_ps();
      for (int64_t i = 0; i < H; i += 8) sq = _mm256_fmadd_ps(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(xr + i), sq);
      const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(lanes_sum(sq) / static_cast<float>(H) + static_cast<float>(eps)));
      for (int64_t i = 0; i < H; i += 8)
        _mm256_storeu_ps(op + r * H + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), inv)));
    }
  });
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "silu_mul", 16);
  const int64_t rows = gate_up.size(0), F = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, F}, gate_up.options().memory_format(at::MemoryFormat::Contiguous));
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t stride = gate_up.stride(0);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = gp + r * stride;
      for (int64_t i = 0; i < F; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        // e^-|x| <= 1 never overflows: sigmoid(x) = 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below
        const __m256 e = exp_nonpositive(_mm256_or_ps(x, sign));
        const __m256 numerator = _mm256_blendv_ps(one, e, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
        const __m256 sigmoid = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
        _mm256_storeu_ps(op + r * F + i, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid), _mm256_loadu_ps(g + F + i)));
      }
    }
  });
  return out;
}

}  // namespace

#define MINIPD_TORCH_LIBRARY_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
MINIPD_TORCH_LIBRARY_FRAGMENT(MINIPD_OPS, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("rms_norm", c10::kCPU, &rms_norm);
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.impl("silu_mul", c10::kCPU, &silu_mul);
}
