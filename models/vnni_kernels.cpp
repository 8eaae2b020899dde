// Matmuls over GGUF's quantized blocks (Q4_0, Q4_1, Q8_0) with 8-bit activations, for x86 CPUs with
// AVX-512 VNNI. Built at first use by vnni_kernels.py and registered as torch ops `minipd_vnni::*`.
//
// y[r, n] = sum_k x[r, k] * w[n, k]. Each row of x (bfloat16) is quantized per block of 32 to
// int8, as llama.cpp does for its CPU dot products: dx = max|x| / 127, qx = round(x / dx). The
// weights stay exactly the file's: Q4 w = d * q + m (Q4_0: m = -8d), Q8_0 w = d * q. Per block,
// the integer dot product of q and qx is exact (vpdpbusd), and the float32 steps are fixed:
//   Q4:   acc = fma(float(sum q*qx), d * dx, acc); acc = fma(m, dx * sum(qx), acc)
//   Q8_0: acc = fma(float(sum q*qx), d * dx, acc)
// blocks in order, then rounded to bfloat16 (to nearest even). So y[r, n] depends on row r of x
// and row n of w only: not on the other rows, how many there are, or the threads.
//
// Weight layout (vnni_kernels.py packs it): output rows in tiles of 16; per tile and block of
// 32 inputs one chunk, tiles and blocks in order. The chunk's weights are 8 rows (k / 4) of 16
// outputs x 4 consecutive inputs, which is vpdpbusd's operand layout:
//   Q4 (320 bytes): 256 bytes holding weight row c (0..3) in the low nibbles and c + 4 in the
//                   high ones, 64 bytes each, then the 16 outputs' d and m (float16)
//   Q8 (576 bytes): the 8 weight rows as int8 (512 bytes), then 16 d (float16) and 16 block
//                   sums of q (int16: vpdpbusd takes one unsigned operand, so qx + 128 goes in
//                   and 128 * sum(q) comes off)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kTile = 16;    // outputs per chunk: one float32 vector
constexpr int64_t kMaxRows = 8;  // rows of x sharing one pass over the weights
constexpr int64_t kQ4Chunk = 256 + 32 + 32;
constexpr int64_t kQ8Chunk = 512 + 32 + 32;

struct Activations {  // x quantized: int8 values (or, for Q8_0 weights, + 128 as uint8), scales, sums
  std::vector<int8_t> q;
  std::vector<float> dx, sx;
};

Activations quantize(const uint16_t* x, int64_t rows, int64_t K, bool offset) {
  const int64_t nb = K / kBlock;
  Activations a{std::vector<int8_t>(rows * K), std::vector<float>(rows * nb), std::vector<float>(rows * nb)};
  for (int64_t i = 0; i < rows * nb; ++i) {
    const __m512i raw = _mm512_loadu_si512(x + i * kBlock);
    const __m512 x0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw)), 16));
    const __m512 x1 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1)), 16));
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));  // to nearest even; |q| <= 127
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
    __m128i b0 = _mm512_cvtsepi32_epi8(q0), b1 = _mm512_cvtsepi32_epi8(q1);
    if (offset) {
      b0 = _mm_xor_si128(b0, _mm_set1_epi8(static_cast<char>(0x80)));
      b1 = _mm_xor_si128(b1, _mm_set1_epi8(static_cast<char>(0x80)));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + i * kBlock), b0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q.data() + i * kBlock + 16), b1);
    a.dx[i] = d;
    a.sx[i] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  }
  return a;
}

inline void store_bf16(uint16_t* y, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(v));
}

inline __m512i broadcast4(const int8_t* p) {  // four consecutive int8 into every 32-bit lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows [0, R) of the quantized x times output tiles [t_begin, t_end).
template <int64_t R>
void q4_rows(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, int64_t t_begin, int64_t t_end,
             uint16_t* y, int64_t N) {
  const int64_t nb = K / kBlock;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t t = t_begin; t < t_end; ++t) {
    __m512 acc[R];
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const uint8_t* chunk = w + t * nb * kQ4Chunk;
    for (int64_t b = 0; b < nb; ++b, chunk += kQ4Chunk) {
      __m512i rows[8];
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(chunk + 64 * c);
        rows[c] = _mm512_and_si512(v, low);
        rows[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 256)));
      const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 288)));
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = (r0 + r) * nb + b;
        const int8_t* xq = a.q.data() + i * kBlock;
        __m512i dot = _mm512_setzero_si512();
        for (int kk = 0; kk < 8; ++kk) dot = _mm512_dpbusd_epi32(dot, rows[kk], broadcast4(xq + 4 * kk));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(a.dx[i])), acc[r]);
        acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.sx[i]), acc[r]);
      }
    }
    for (int64_t r = 0; r < R; ++r) store_bf16(y + r * N + t * kTile, acc[r]);
  }
}

template <int64_t R>
void q8_rows(const Activations& a, int64_t r0, int64_t K, const uint8_t* w, int64_t t_begin, int64_t t_end,
             uint16_t* y, int64_t N) {
  const int64_t nb = K / kBlock;
  for (int64_t t = t_begin; t < t_end; ++t) {
    __m512 acc[R];
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const uint8_t* chunk = w + t * nb * kQ8Chunk;
    for (int64_t b = 0; b < nb; ++b, chunk += kQ8Chunk) {
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 512)));
      const __m512i offset = _mm512_slli_epi32(
          _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 544))), 7);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = (r0 + r) * nb + b;
        const int8_t* xq = a.q.data() + i * kBlock;
        __m512i dot = _mm512_setzero_si512();
        for (int kk = 0; kk < 8; ++kk)
          dot = _mm512_dpbusd_epi32(dot, broadcast4(xq + 4 * kk), _mm512_loadu_si512(chunk + 64 * kk));
        dot = _mm512_sub_epi32(dot, offset);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(a.dx[i])), acc[r]);
      }
    }
    for (int64_t r = 0; r < R; ++r) store_bf16(y + r * N + t * kTile, acc[r]);
  }
}

using RowsFn = void (*)(const Activations&, int64_t, int64_t, const uint8_t*, int64_t, int64_t, uint16_t*, int64_t);

template <bool Q8>
RowsFn rows_fn(int64_t R) {
  static constexpr RowsFn q4[] = {q4_rows<1>, q4_rows<2>, q4_rows<3>, q4_rows<4>,
                                  q4_rows<5>, q4_rows<6>, q4_rows<7>, q4_rows<8>};
  static constexpr RowsFn q8[] = {q8_rows<1>, q8_rows<2>, q8_rows<3>, q8_rows<4>,
                                  q8_rows<5>, q8_rows<6>, q8_rows<7>, q8_rows<8>};
  return (Q8 ? q8 : q4)[R - 1];
}

template <bool Q8>
at::Tensor vnni_mm(const at::Tensor& x_in, const at::Tensor& w, int64_t in_features) {
  const int64_t chunk = Q8 ? kQ8Chunk : kQ4Chunk;
  TORCH_CHECK(in_features > 0 && in_features % kBlock == 0, "minipd_vnni: in_features must be a positive multiple of ",
              kBlock, ", got ", in_features);
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == in_features / kBlock * chunk,
              "minipd_vnni: packed weights must be a contiguous uint8 CPU tensor [out / 16, ",
              in_features / kBlock * chunk, "]");
  TORCH_CHECK(x_in.device().is_cpu() && x_in.scalar_type() == at::kBFloat16 && x_in.dim() == 2 &&
                  x_in.size(1) == in_features,
              "minipd_vnni: x must be a bfloat16 CPU tensor [rows, ", in_features, "]");
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0), tiles = w.size(0), N = tiles * kTile;
  at::Tensor y = at::empty({rows, N}, x.options());
  if (rows == 0 || N == 0) return y;
  const Activations a = quantize(reinterpret_cast<const uint16_t*>(x.data_ptr()), rows, in_features, Q8);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  // Threads split the output tiles; each output is still computed by one thread, in one order.
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
      const int64_t R = std::min(kMaxRows, rows - r0);
      rows_fn<Q8>(R)(a, r0, in_features, wp, t0, t1, yp + r0 * N, N);
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(minipd_vnni, m) {
  m.def("q4_mm(Tensor x, Tensor packed, int in_features) -> Tensor");
  m.def("q8_mm(Tensor x, Tensor packed, int in_features) -> Tensor");
  m.impl("q4_mm", c10::kCPU, &vnni_mm<false>);
  m.impl("q8_mm", c10::kCPU, &vnni_mm<true>);
}
