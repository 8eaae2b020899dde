// Matmuls over GGUF's quantized blocks (Q4_0, Q4_1, Q8_0; the K-quants Q4_K and Q6_K: kquant_tiles.h)
// with 8-bit activations, for x86 CPUs.
// Built at first use by vnni_kernels.py, once per instruction set, and registered as torch ops
// `MINIPD_OPS::*` (minipd_vnni with AVX-512 VNNI, minipd_avx2 with AVX2 only).
//
// y[r, n] = sum_k x[r, k] * w[n, k]. Each row of x (bfloat16 or float32) is quantized per block of
// 32 to int8, as llama.cpp does for its CPU dot products: dx = max|x| / 127, qx = round(x / dx).
// The weights stay exactly the file's: Q4 w = d * q + m (Q4_0: m = -8d), Q8_0 w = d * q. Per
// block, the integer dot product of q and qx is exact (vpdpbusd; on AVX2 vpmaddubsw, whose 16-bit
// pair sums cannot saturate here: 4-bit q times |qx| <= 127 sums to at most 8 * 3810 per output,
// and Q8_0 goes through |w| and sign(qx, w), at most 32512 a pair), and the float32 steps are fixed:
//   Q4:   acc = fma(float(sum q*qx), d * dx, acc); acc = fma(m, dx * sum(qx), acc)
//   Q8_0: acc = fma(float(sum q*qx), d * dx, acc)
// blocks in order, then returned as float32 or rounded to bfloat16 (to nearest even), x's dtype.
// So y[r, n] depends on row r of x and row n of w only: not on the other rows, how many there
// are, the threads, or which instruction set computed it (both give the same bits).
//
// Weight layout (vnni_kernels.py packs it): output rows in tiles of 16; per tile and block of
// 32 inputs one chunk, tiles and blocks in order. The chunk's weights are 8 rows (k / 4) of 16
// outputs x 4 consecutive inputs, which is vpdpbusd's operand layout (AVX2 takes each row as
// two halves of 8 outputs):
//   Q4 (320 bytes): 256 bytes holding weight row c (0..3) in the low nibbles and c + 4 in the
//                   high ones, 64 bytes each, then the 16 outputs' d and m (float16)
//   Q8 (576 bytes): the 8 weight rows as int8 (512 bytes), then 16 d (float16) and 16 block
//                   sums of q (int16: vpdpbusd takes one unsigned operand, so qx + 128 goes in
//                   and 128 * sum(q) comes off; the AVX2 path does not read them)

#include "block_matmul.h"

#ifndef MINIPD_OPS
#error "build with -DMINIPD_OPS=<the ops' namespace> (vnni_kernels.py does)"
#endif

namespace {
using namespace minipd_int8;

template <bool Q8>
at::Tensor quantized_mm(const at::Tensor& x_in, const at::Tensor& w, int64_t in_features) {
  const int64_t chunk = Q8 ? kQ8Chunk : kQ4Chunk;
  TORCH_CHECK(in_features > 0 && in_features % kBlock == 0, "minipd kernels: in_features must be a positive multiple of ",
              kBlock, ", got ", in_features);
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() &&
                  w.size(1) == in_features / kBlock * chunk,
              "minipd kernels: packed weights must be a contiguous uint8 CPU tensor [out / 16, ",
              in_features / kBlock * chunk, "]");
  TORCH_CHECK(x_in.device().is_cpu() && (x_in.scalar_type() == at::kBFloat16 || x_in.scalar_type() == at::kFloat) &&
                  x_in.dim() == 2 && x_in.size(1) == in_features,
              "minipd kernels: x must be a bfloat16 or float32 CPU tensor [rows, ", in_features, "]");
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty({x.size(0), w.size(0) * kTile}, x.options());
  if (y.numel() == 0) return y;
  const int64_t rows = x.size(0), tiles = w.size(0);
  const int64_t format = Q8 ? kFormatQ8 : kFormatQ4, N = tiles * kTile;
  if (x.scalar_type() == at::kFloat)
    multiply_format(format, x.data_ptr<float>(), rows, in_features, w.data_ptr<uint8_t>(), tiles, y.data_ptr<float>(), N);
  else
    multiply_format(format, x.data_ptr<at::BFloat16>(), rows, in_features, w.data_ptr<uint8_t>(), tiles,
                    y.data_ptr<at::BFloat16>(), N);
  return y;
}

// x @ w.T for a weight of segments in any format (block_matmul.h): packed is any contiguous uint8
// CPU tensor holding the segments' tiles in order.
at::Tensor blocks_mm(const at::Tensor& x_in, const at::Tensor& w, int64_t in_features, at::IntArrayRef formats,
                     at::IntArrayRef outs) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.is_contiguous(),
              "minipd kernels: packed weights must be a contiguous uint8 CPU tensor");
  const std::string why = check_segments(formats.vec(), outs.vec(), in_features, w.numel());
  TORCH_CHECK(why.empty(), "minipd kernels: blocks_mm: ", why);
  TORCH_CHECK(x_in.device().is_cpu() && (x_in.scalar_type() == at::kBFloat16 || x_in.scalar_type() == at::kFloat) &&
                  x_in.dim() == 2 && x_in.size(1) == in_features,
              "minipd kernels: x must be a bfloat16 or float32 CPU tensor [rows, ", in_features, "]");
  const at::Tensor x = x_in.contiguous();
  int64_t N = 0;
  for (const int64_t o : outs) N += o;
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  if (y.numel() == 0) return y;
  const int64_t segments = static_cast<int64_t>(formats.size());
  if (x.scalar_type() == at::kFloat)
    multiply_segments(formats.data(), outs.data(), segments, x.data_ptr<float>(), x.size(0), in_features,
                      w.data_ptr<uint8_t>(), y.data_ptr<float>());
  else
    multiply_segments(formats.data(), outs.data(), segments, x.data_ptr<at::BFloat16>(), x.size(0), in_features,
                      w.data_ptr<uint8_t>(), y.data_ptr<at::BFloat16>());
  return y;
}

// Rows `ids` of a Q8_0 weight packed as above, dequantized as GGUF does (float32 d * q), in
// `dtype` (float32, or bfloat16 rounded to nearest even, as .to() rounds): embedding lookups
// from a tied lm_head's blocks (block_embedding.py).
at::Tensor q8_rows(const at::Tensor& w, const at::Tensor& ids_in, int64_t in_features, at::ScalarType dtype) {
  TORCH_CHECK(in_features > 0 && in_features % kBlock == 0 && w.scalar_type() == at::kByte && w.dim() == 2 &&
                  w.is_contiguous() && w.size(1) == in_features / kBlock * kQ8Chunk,
              "minipd kernels: q8_rows needs Q8_0 blocks packed for [out, ", in_features, "]");
  TORCH_CHECK(ids_in.scalar_type() == at::kLong, "minipd kernels: q8_rows takes int64 ids");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "minipd kernels: q8_rows answers float32 or bfloat16");
  const at::Tensor ids = ids_in.contiguous();
  const int64_t n = ids.numel(), nb = in_features / kBlock, rows = w.size(0) * kTile;
  at::Tensor out = at::empty({n, in_features}, w.options().dtype(at::kFloat));
  const int64_t* id = ids.data_ptr<int64_t>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(id[r] >= 0 && id[r] < rows, "minipd kernels: id ", id[r], " is not below ", rows);
    const int64_t tile = id[r] / kTile, lane = id[r] % kTile;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* chunk = wp + (tile * nb + b) * kQ8Chunk;
      at::Half d;
      std::memcpy(&d, chunk + 512 + 2 * lane, 2);
      const float scale = static_cast<float>(d);
      for (int64_t k = 0; k < kBlock; ++k)
        o[r * in_features + b * kBlock + k] = scale * static_cast<float>(static_cast<int8_t>(chunk[(k / 4) * 64 + lane * 4 + k % 4]));
    }
  }
  return dtype == at::kFloat ? out : out.to(dtype);
}

}  // namespace

// TORCH_LIBRARY pastes its namespace argument; one more macro level expands MINIPD_OPS first.
#define MINIPD_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
MINIPD_TORCH_LIBRARY(MINIPD_OPS, m) {
  m.def("q4_mm(Tensor x, Tensor packed, int in_features) -> Tensor");
  m.def("q8_mm(Tensor x, Tensor packed, int in_features) -> Tensor");
  m.impl("q4_mm", c10::kCPU, &quantized_mm<false>);
  m.impl("q8_mm", c10::kCPU, &quantized_mm<true>);
  m.def("blocks_mm(Tensor x, Tensor packed, int in_features, int[] formats, int[] outs) -> Tensor");
  m.impl("blocks_mm", c10::kCPU, &blocks_mm);
  m.def("q8_rows(Tensor packed, Tensor ids, int in_features, ScalarType dtype) -> Tensor");
  m.impl("q8_rows", c10::kCPU, &q8_rows);
}
