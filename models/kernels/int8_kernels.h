// minipd's int8 matmul kernels over GGUF's blocks of 32 (Q4_0/Q4_1 and Q8_0 tiles), the activations'
// quantization and the output stores, shared through block_matmul.h by the ops in vnni_kernels.cpp
// and fused_decode.cpp (decode_step). What they compute and the weight layout: see the header
// comment of vnni_kernels.cpp. Everything here has internal linkage (one copy per source).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace minipd_int8 {
namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kTile = 16;  // outputs per chunk: one AVX-512 float32 vector, two AVX2 ones
#if defined(__AVX512VNNI__)
constexpr int64_t kMaxRows = 8;  // rows of x sharing one pass over a tile's weights
#else
constexpr int64_t kMaxRows = 4;  // AVX2 has 16 vector registers: 4 accumulators + 8 weight rows
#endif
constexpr int64_t kQ4Chunk = 256 + 32 + 32;
constexpr int64_t kQ8Chunk = 512 + 32 + 32;

struct Activations {  // x quantized: int8 values (or, for Q8_0 weights, + 128 as uint8), scales, sums
  std::vector<int8_t> q;
  std::vector<float> dx, sx;
  std::vector<int32_t> halves;  // per block, the integer sums of q over inputs 0..15 and 16..31 (Q6_K's groups)
};

inline void to_float(const float* x, float* out) { std::memcpy(out, x, kBlock * sizeof(float)); }
inline void to_float(const at::BFloat16* x, float* out) {
  for (int64_t j = 0; j < kBlock; ++j) {
    uint16_t raw;
    std::memcpy(&raw, x + j, 2);
    const uint32_t bits = static_cast<uint32_t>(raw) << 16;
    std::memcpy(out + j, &bits, 4);
  }
}

#if defined(__AVX512VNNI__)
// One block of 32 floats to int8: returns dx, writes q and the integer sums of its two halves of 16.
inline float quantize_block(const float* xf, int8_t* q, int32_t* sums, bool offset) {
  const __m512 x0 = _mm512_loadu_ps(xf), x1 = _mm512_loadu_ps(xf + 16);
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
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), b0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), b1);
  sums[0] = _mm512_reduce_add_epi32(q0);
  sums[1] = _mm512_reduce_add_epi32(q1);
  return d;
}
#else
inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline float quantize_block(const float* xf, int8_t* q, int32_t* sums, bool /*offset: AVX-512 only*/) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4];
  __m256 amax = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    x[j] = _mm256_loadu_ps(xf + 8 * j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, x[j]));
  }
  const float d = hmax(amax) / 127.0f;
  const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  __m256i qi[4];
  for (int j = 0; j < 4; ++j) qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(x[j], id));  // to nearest even
  sums[0] = hsum(_mm256_add_epi32(qi[0], qi[1]));
  sums[1] = hsum(_mm256_add_epi32(qi[2], qi[3]));
  // packs interleave 128-bit lanes: dwords come out as q0[0:4] q1[0:4] q2[0:4] q3[0:4] q0[4:8] ...
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  return d;
}
#endif

// x quantized into this thread's buffers, valid until its next call on this thread. Reused
// because fresh vectors cost more than the quantizing: zero-filled, and above malloc's mmap
// threshold new pages to fault in on every call (a 512-row prefill chunk: ~0.4 ms a matmul).
template <typename In>
const Activations& quantize(const In* x, int64_t rows, int64_t K, bool offset) {
  thread_local Activations a;  // grows, never shrinks; resize keeps what is there unwritten
  const int64_t nb = K / kBlock;
  a.q.resize(rows * K);
  a.dx.resize(rows * nb);
  a.sx.resize(rows * nb);
  a.halves.resize(2 * rows * nb);
  alignas(64) float xf[kBlock];
  for (int64_t i = 0; i < rows * nb; ++i) {
    const float* block = xf;
    if constexpr (std::is_same_v<In, float>)
      block = x + i * kBlock;
    else
      to_float(x + i * kBlock, xf);
    int32_t* halves = a.halves.data() + 2 * i;
    const float d = quantize_block(block, a.q.data() + i * kBlock, halves, offset);
    a.dx[i] = d;
    a.sx[i] = d * static_cast<float>(halves[0] + halves[1]);
  }
  return a;
}

inline __m256i broadcast4_256(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Eight float32 outputs to y as float32, or rounded to bfloat16 to nearest even (as
// vcvtneps2bf16 does: NaN stays NaN, a denormal becomes a zero of its sign).
inline void store8(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
inline void store8(at::BFloat16* y, __m256 v) {
  __m256i bits = _mm256_castps_si256(v);
  const __m256i exponent = _mm256_and_si256(bits, _mm256_set1_epi32(0x7F800000));
  const __m256i denormal = _mm256_cmpeq_epi32(exponent, _mm256_setzero_si256());
  bits = _mm256_blendv_epi8(bits, _mm256_and_si256(bits, _mm256_set1_epi32(0x80000000u)), denormal);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y), packed);
}

#if defined(__AVX512VNNI__)
inline void store16(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
inline void store16(at::BFloat16* y, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(v));
}

inline __m512i broadcast4(const int8_t* p) {  // four consecutive int8 into every 32-bit lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The Q4 steps of block b (256 bytes of nibbles at `nibbles`) for rows [r0, r0 + R): per output
// scale d and zero m; Q4_0/Q4_1 tiles and Q4_K's (kquant_tiles.h) both go through it.
template <int64_t R>
inline void q4_block(const Activations& a, int64_t r0, int64_t nb, int64_t b, const uint8_t* nibbles, __m512 d,
                     __m512 m, __m512* acc) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i rows[8];
  for (int c = 0; c < 4; ++c) {
    const __m512i v = _mm512_loadu_si512(nibbles + 64 * c);
    rows[c] = _mm512_and_si512(v, low);
    rows[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = (r0 + r) * nb + b;
    const int8_t* xq = a.q.data() + i * kBlock;
    __m512i dot = _mm512_setzero_si512();
    for (int kk = 0; kk < 8; ++kk) dot = _mm512_dpbusd_epi32(dot, rows[kk], broadcast4(xq + 4 * kk));
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(a.dx[i])), acc[r]);
    acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.sx[i]), acc[r]);
  }
}

// Rows [r0, r0 + R) of the quantized x times one tile (16 outputs) of packed weights.
template <int64_t R, typename Out>
void q4_tile(const Activations& a, int64_t r0, int64_t nb, const uint8_t* chunk, Out* y, int64_t N) {
  __m512 acc[R];
  for (int64_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, chunk += kQ4Chunk) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 256)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 288)));
    q4_block<R>(a, r0, nb, b, chunk, d, m, acc);
  }
  for (int64_t r = 0; r < R; ++r) store16(y + r * N, acc[r]);
}

template <int64_t R, typename Out>
void q8_tile(const Activations& a, int64_t r0, int64_t nb, const uint8_t* chunk, Out* y, int64_t N) {
  __m512 acc[R];
  for (int64_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, chunk += kQ8Chunk) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 512)));
    const __m512i offset =
        _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 544))), 7);
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
  for (int64_t r = 0; r < R; ++r) store16(y + r * N, acc[r]);
}
#else
// AVX2: each tile as two halves of 8 outputs (bytes 32h..32h+31 of every 64-byte weight row).
// The Q4 steps of block b for rows [r0, r0 + R) on one half of a tile (the 32 bytes at
// `nibbles` + 64c of each weight row c); Q4_0/Q4_1 tiles and Q4_K's (kquant_tiles.h) both go through it.
template <int64_t R>
inline void q4_block(const Activations& a, int64_t r0, int64_t nb, int64_t b, const uint8_t* nibbles, __m256 d,
                     __m256 m, __m256* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i rows[8];
  for (int c = 0; c < 4; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nibbles + 64 * c));
    rows[c] = _mm256_and_si256(v, low);
    rows[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = (r0 + r) * nb + b;
    const int8_t* xq = a.q.data() + i * kBlock;
    // 16-bit sums: 8 pairs of at most 2 * 15 * 127 each stay below 32767, so nothing saturates
    __m256i pairs = _mm256_maddubs_epi16(rows[0], broadcast4_256(xq));
    for (int kk = 1; kk < 8; ++kk)
      pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(rows[kk], broadcast4_256(xq + 4 * kk)));
    const __m256i dot = _mm256_madd_epi16(pairs, ones);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(a.dx[i])), acc[r]);
    acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.sx[i]), acc[r]);
  }
}

template <int64_t R, typename Out>
void q4_tile(const Activations& a, int64_t r0, int64_t nb, const uint8_t* chunk, Out* y, int64_t N) {
  for (int h = 0; h < 2; ++h) {
    __m256 acc[R];
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint8_t* block = chunk;
    for (int64_t b = 0; b < nb; ++b, block += kQ4Chunk) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 256 + 16 * h)));
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 288 + 16 * h)));
      q4_block<R>(a, r0, nb, b, block + 32 * h, d, m, acc);
    }
    for (int64_t r = 0; r < R; ++r) store8(y + r * N + 8 * h, acc[r]);
  }
}

template <int64_t R, typename Out>
void q8_tile(const Activations& a, int64_t r0, int64_t nb, const uint8_t* chunk, Out* y, int64_t N) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[R];
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint8_t* block = chunk;
    for (int64_t b = 0; b < nb; ++b, block += kQ8Chunk) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 512 + 16 * h)));
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = (r0 + r) * nb + b;
        const int8_t* xq = a.q.data() + i * kBlock;
        __m256i dot = _mm256_setzero_si256();
        for (int kk = 0; kk < 8; ++kk) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * kk + 32 * h));
          // |w| (unsigned, <= 128) times qx with w's sign: a pair sums to at most 2 * 128 * 127
          const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(broadcast4_256(xq + 4 * kk), w));
          dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
        }
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(a.dx[i])), acc[r]);
      }
    }
    for (int64_t r = 0; r < R; ++r) store8(y + r * N + 8 * h, acc[r]);
  }
}
#endif

}  // namespace
}  // namespace minipd_int8
