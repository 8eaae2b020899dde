// Tiles of 16 outputs over GGUF's K-quant super-blocks of 256 inputs (Q4_K, Q6_K), with the
// activations quantized per block of 32 as for the other formats (int8_kernels.h). Included by
// block_matmul.h, which dispatches every format; internal linkage (one copy per source).
//
// Layout (vnni_kernels.py `pack_q4k` / `pack_q6k`): per tile of 16 outputs and super-block of
// 256 inputs one chunk, tiles and super-blocks in order. Each of its 8 blocks of 32 inputs holds
// 256 bytes of nibbles exactly as a Q4 chunk does (8 rows of 16 outputs x 4 consecutive inputs,
// row c in the low nibbles and c + 4 in the high ones of 64 bytes), then:
//   Q4_K (2368 bytes): the 8 x 16 six-bit scales sc (uint8, block-major), the 8 x 16 six-bit
//     mins m (uint8), the 16 outputs' d, then their dmin (float16). w = (d * sc) * q - (dmin * m)
//     per block of 32, as GGUF dequantizes it (both products exact in float32).
//   Q6_K (3360 bytes): the high 2 bits of q (8 blocks x 128 bytes: rows c = 0..3 of the block's
//     first 64 bytes and rows 4..7 of its second at bits 2c..2c+1 of each byte), the 16 x 16
//     int8 scales sc (group-major; group g covers inputs 16g..16g+15), then the 16 outputs' d
//     (float16). w = d * sc * (q - 32), q = 0..63.
// What a tile computes, per block b of 32 inputs (dx, sx = dx * sum(qx): int8_kernels.h):
//   Q4_K: scale = d * float(sc), zero = -(dmin * float(m)) (exact: 11-bit d times 6-bit sc), then
//         exactly the Q4 steps: acc = fma(float(sum q*qx), scale * dx, acc); acc = fma(zero, sx, acc)
//   Q6_K: i = sc_lo * (sum_lo q*qx - 32 * sum_lo qx) + sc_hi * (sum_hi ... ) over the block's two
//         groups of 16, in int32 (exact: |i| <= 2 * 128 * 32 * 127 * 16 < 2^24, so float(i) is too),
//         then exactly the Q8_0 step: acc = fma(float(i), d * dx, acc)
// So Q4_K gives the Q4 kernel's bits for weights whose d * sc and dmin * m are float16 values, and
// Q6_K the Q8_0 kernel's for weights whose sc * (q - 32) fit int8 (tests/unit/models/test_kquant_kernels.py).
// Integer sums: vpdpbusd (exact); AVX2's vpmaddubsw pairs of 6-bit q reach 2 * 63 * 127, so only two
// are added in 16 bits before vpmaddwd widens them (Q4_K: 4-bit q, as the Q4 tile: eight).
#pragma once

#include "int8_kernels.h"

namespace minipd_int8 {
namespace {

constexpr int64_t kSuperBlocks = 8;  // blocks of 32 per K-quant super-block of 256
constexpr int64_t kQ4KChunk = 8 * 256 + 128 + 128 + 32 + 32;
constexpr int64_t kQ6KChunk = 8 * 256 + 8 * 128 + 256 + 32;
constexpr int64_t kQ4KScales = 2048, kQ4KMins = 2176, kQ4KD = 2304, kQ4KDmin = 2336;
constexpr int64_t kQ6KHigh = 2048, kQ6KScales = 3072, kQ6KD = 3328;

#if defined(__AVX512VNNI__)
inline __m512 bytes_to_ps(const uint8_t* p) {  // 16 uint8 -> float32
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 half_to_ps(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512i high_bits(__m512i h, int c) {  // bits 2c..2c+1 of each byte to bits 4..5
  const __m512i mask = _mm512_set1_epi8(0x30);
  switch (c) {
    case 0: return _mm512_and_si512(_mm512_slli_epi16(h, 4), mask);
    case 1: return _mm512_and_si512(_mm512_slli_epi16(h, 2), mask);
    case 2: return _mm512_and_si512(h, mask);
    default: return _mm512_and_si512(_mm512_srli_epi16(h, 2), mask);
  }
}

template <int64_t R, typename Out>
void q4k_tile(const Activations& a, int64_t r0, int64_t nb, const uint8_t* chunk, Out* y, int64_t N) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  __m512 acc[R];
  for (int64_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nb / kSuperBlocks; ++s, chunk += kQ4KChunk) {
    const __m512 d = half_to_ps(chunk + kQ4KD), dmin = half_to_ps(chunk + kQ4KDmin);
    for (int64_t j = 0; j < kSuperBlocks; ++j) {
      const __m512 scale = _mm512_mul_ps(d, bytes_to_ps(chunk + kQ4KScales + 16 * j));
      const __m512 zero = _mm512_xor_ps(_mm512_mul_ps(dmin, bytes_to_ps(chunk + kQ4KMins + 16 * j)), sign);
      q4_block<R>(a, r0, nb, s * kSuperBlocks + j, chunk + 256 * j, scale, zero, acc);
    }
  }
  for (int64_t r = 0; r < R; ++r) store16(y + r * N, acc[r]);
}

template <int64_t R, typename Out>
void q6k_tile(const Activations& a, int64_t r0, int64_t nb, const uint8_t* chunk, Out* y, int64_t N) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int64_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nb / kSuperBlocks; ++s, chunk += kQ6KChunk) {
    const __m512 d = half_to_ps(chunk + kQ6KD);
    for (int64_t j = 0; j < kSuperBlocks; ++j) {
      const uint8_t* block = chunk + 256 * j;
      const __m512i h0 = _mm512_loadu_si512(chunk + kQ6KHigh + 128 * j);
      const __m512i h1 = _mm512_loadu_si512(chunk + kQ6KHigh + 128 * j + 64);
      __m512i rows[8];
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(block + 64 * c);
        rows[c] = _mm512_or_si512(_mm512_and_si512(v, low), high_bits(h0, c));
        rows[c + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), high_bits(h1, c));
      }
      const uint8_t* sc = chunk + kQ6KScales + 32 * j;
      const __m512i sc_lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
      const __m512i sc_hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16)));
      for (int64_t r = 0; r < R; ++r) {
        const int64_t i = (r0 + r) * nb + s * kSuperBlocks + j;
        const int8_t* xq = a.q.data() + i * kBlock;
        __m512i lo = _mm512_set1_epi32(-32 * a.halves[2 * i]), hi = _mm512_set1_epi32(-32 * a.halves[2 * i + 1]);
        for (int kk = 0; kk < 4; ++kk) {
          lo = _mm512_dpbusd_epi32(lo, rows[kk], broadcast4(xq + 4 * kk));
          hi = _mm512_dpbusd_epi32(hi, rows[kk + 4], broadcast4(xq + 16 + 4 * kk));
        }
        const __m512i dot = _mm512_add_epi32(_mm512_mullo_epi32(sc_lo, lo), _mm512_mullo_epi32(sc_hi, hi));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(a.dx[i])), acc[r]);
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) store16(y + r * N, acc[r]);
}
#else
// AVX2: each tile as two halves of 8 outputs, as int8_kernels.h's tiles.
inline __m256 bytes_to_ps(const uint8_t* p) {  // 8 uint8 -> float32
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 half_to_ps(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256i high_bits(__m256i h, int c) {  // bits 2c..2c+1 of each byte to bits 4..5
  const __m256i mask = _mm256_set1_epi8(0x30);
  switch (c) {
    case 0: return _mm256_and_si256(_mm256_slli_epi16(h, 4), mask);
    case 1: return _mm256_and_si256(_mm256_slli_epi16(h, 2), mask);
    case 2: return _mm256_and_si256(h, mask);
    default: return _mm256_and_si256(_mm256_srli_epi16(h, 2), mask);
  }
}

template <int64_t R, typename Out>
void q4k_tile(const Activations& a, int64_t r0, int64_t nb, const uint8_t* chunk, Out* y, int64_t N) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[R];
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint8_t* super = chunk;
    for (int64_t s = 0; s < nb / kSuperBlocks; ++s, super += kQ4KChunk) {
      const __m256 d = half_to_ps(super + kQ4KD + 16 * h), dmin = half_to_ps(super + kQ4KDmin + 16 * h);
      for (int64_t j = 0; j < kSuperBlocks; ++j) {
        const __m256 scale = _mm256_mul_ps(d, bytes_to_ps(super + kQ4KScales + 16 * j + 8 * h));
        const __m256 zero = _mm256_xor_ps(_mm256_mul_ps(dmin, bytes_to_ps(super + kQ4KMins + 16 * j + 8 * h)), sign);
        q4_block<R>(a, r0, nb, s * kSuperBlocks + j, super + 256 * j + 32 * h, scale, zero, acc);
      }
    }
    for (int64_t r = 0; r < R; ++r) store8(y + r * N + 8 * h, acc[r]);
  }
}

template <int64_t R, typename Out>
void q6k_tile(const Activations& a, int64_t r0, int64_t nb, const uint8_t* chunk, Out* y, int64_t N) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[R];
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint8_t* super = chunk;
    for (int64_t s = 0; s < nb / kSuperBlocks; ++s, super += kQ6KChunk) {
      const __m256 d = half_to_ps(super + kQ6KD + 16 * h);
      for (int64_t j = 0; j < kSuperBlocks; ++j) {
        const uint8_t* block = super + 256 * j;
        const uint8_t* high = super + kQ6KHigh + 128 * j + 32 * h;
        const __m256i h0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high));
        const __m256i h1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high + 64));
        __m256i rows[8];
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * c + 32 * h));
          rows[c] = _mm256_or_si256(_mm256_and_si256(v, low), high_bits(h0, c));
          rows[c + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), high_bits(h1, c));
        }
        const uint8_t* sc = super + kQ6KScales + 32 * j + 8 * h;
        const __m256i sc_lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
        const __m256i sc_hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16)));
        for (int64_t r = 0; r < R; ++r) {
          const int64_t i = (r0 + r) * nb + s * kSuperBlocks + j;
          const int8_t* xq = a.q.data() + i * kBlock;
          __m256i part[2];
          for (int g = 0; g < 2; ++g) {  // two pairs of rows at a time: <= 2 * (2 * 63 * 127) in 16 bits
            const int8_t* xg = xq + 16 * g;
            const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(rows[4 * g], broadcast4_256(xg)),
                                                 _mm256_maddubs_epi16(rows[4 * g + 1], broadcast4_256(xg + 4)));
            const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(rows[4 * g + 2], broadcast4_256(xg + 8)),
                                                 _mm256_maddubs_epi16(rows[4 * g + 3], broadcast4_256(xg + 12)));
            part[g] = _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones)),
                                       _mm256_set1_epi32(-32 * a.halves[2 * i + g]));
          }
          const __m256i dot = _mm256_add_epi32(_mm256_mullo_epi32(sc_lo, part[0]), _mm256_mullo_epi32(sc_hi, part[1]));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(a.dx[i])), acc[r]);
        }
      }
    }
    for (int64_t r = 0; r < R; ++r) store8(y + r * N + 8 * h, acc[r]);
  }
}
#endif

}  // namespace
}  // namespace minipd_int8
