// y = x @ w.T for weights packed in any of minipd's block formats, and for a weight made of
// segments of several formats stacked along the outputs (q/k/v of a Q4_K_M file: q and k in Q4_K,
// v in Q6_K). Shared by vnni_kernels.cpp (the ops) and fused_decode.cpp; internal linkage.
//
// Formats (vnni_kernels.py FORMATS): 0 Q4 (Q4_0/Q4_1, 320 bytes per tile and block of 32),
// 1 Q8 (Q8_0, or Q5_0 repacked exactly, 576), 2 Q4_K (2368 per tile and super-block of 256),
// 3 Q6_K (3360). What each computes: vnni_kernels.cpp and kquant_tiles.h. Every output is computed
// by one thread in one order from its row of x and its row of w only.
#pragma once

#include <string>

#include "int8_kernels.h"
#include "kquant_tiles.h"

namespace minipd_int8 {
namespace {

enum Format : int64_t { kFormatQ4 = 0, kFormatQ8 = 1, kFormatQ4K = 2, kFormatQ6K = 3 };

// Bytes of one tile (16 outputs) of `format` over `in_features` inputs; -1 for an unknown format
// or inputs it cannot take (K-quants: multiples of 256).
inline int64_t tile_bytes(int64_t format, int64_t in_features) {
  const int64_t nb = in_features / kBlock;
  switch (format) {
    case kFormatQ4: return nb * kQ4Chunk;
    case kFormatQ8: return nb * kQ8Chunk;
    case kFormatQ4K: return nb % kSuperBlocks ? -1 : nb / kSuperBlocks * kQ4KChunk;
    case kFormatQ6K: return nb % kSuperBlocks ? -1 : nb / kSuperBlocks * kQ6KChunk;
    default: return -1;
  }
}

template <typename Out>
using TileFn = void (*)(const Activations&, int64_t, int64_t, const uint8_t*, Out*, int64_t);

template <typename Out, int64_t... R>
TileFn<Out> tile_fn_of(int64_t format, int64_t rows, std::integer_sequence<int64_t, R...>) {
  static constexpr TileFn<Out> q4[] = {q4_tile<R + 1, Out>...};
  static constexpr TileFn<Out> q8[] = {q8_tile<R + 1, Out>...};
  static constexpr TileFn<Out> q4k[] = {q4k_tile<R + 1, Out>...};
  static constexpr TileFn<Out> q6k[] = {q6k_tile<R + 1, Out>...};
  switch (format) {
    case kFormatQ8: return q8[rows - 1];
    case kFormatQ4K: return q4k[rows - 1];
    case kFormatQ6K: return q6k[rows - 1];
    default: return q4[rows - 1];
  }
}

template <typename Out>
TileFn<Out> tile_fn(int64_t format, int64_t rows) {
  return tile_fn_of<Out>(format, rows, std::make_integer_sequence<int64_t, kMaxRows>{});
}

// y [rows, ldy] (columns [0, tiles * 16)) = x [rows, in_features] @ w.T for `tiles` tiles of
// `format` at wp. Raw pointers, contiguous rows; the callers check shapes and formats.
template <typename T>
void multiply_format(int64_t format, const T* x, int64_t rows, int64_t in_features, const uint8_t* wp, int64_t tiles,
                     T* yp, int64_t ldy) {
  const int64_t chunk = tile_bytes(format, in_features), nb = in_features / kBlock;
  const Activations& a = quantize(x, rows, in_features, format == kFormatQ8);
  // Threads split the output tiles; each output is still computed by one thread, in one order.
  // Row groups go inside the tile loop so that a tile's weights are read from memory once.
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
        const int64_t R = std::min(kMaxRows, rows - r0);
        tile_fn<T>(format, R)(a, r0, nb, wp + t * chunk, yp + r0 * ldy + t * kTile, ldy);
      }
    }
  });
}

// y [rows, sum(outs)] for a weight of segments: segment s has outs[s] outputs (a multiple of 16) in
// formats[s], its tiles following the previous segment's bytes.
template <typename T>
void multiply_segments(const int64_t* formats, const int64_t* outs, int64_t segments, const T* x, int64_t rows,
                       int64_t in_features, const uint8_t* wp, T* yp) {
  int64_t ldy = 0;
  for (int64_t s = 0; s < segments; ++s) ldy += outs[s];
  for (int64_t s = 0, column = 0; s < segments; column += outs[s], ++s) {
    multiply_format(formats[s], x, rows, in_features, wp, outs[s] / kTile, yp + column, ldy);
    wp += outs[s] / kTile * tile_bytes(formats[s], in_features);
  }
}

// Why `packed` (bytes) cannot hold segments (formats, outs) over `in_features` inputs, or "".
inline std::string check_segments(const std::vector<int64_t>& formats, const std::vector<int64_t>& outs,
                                  int64_t in_features, int64_t packed_bytes) {
  if (formats.empty() || formats.size() != outs.size()) return "formats and outs must be non-empty and as long";
  if (in_features <= 0 || in_features % kBlock) return "in_features must be a positive multiple of 32";
  int64_t bytes = 0;
  for (size_t s = 0; s < formats.size(); ++s) {
    const int64_t tile = tile_bytes(formats[s], in_features);
    if (tile < 0) return "format " + std::to_string(formats[s]) + " is unknown or takes no " + std::to_string(in_features) + " inputs";
    if (outs[s] <= 0 || outs[s] % kTile) return "each segment's outputs must be a positive multiple of 16";
    bytes += outs[s] / kTile * tile;
  }
  if (bytes != packed_bytes) return "the packed weights hold " + std::to_string(packed_bytes) + " bytes, the segments " + std::to_string(bytes);
  return "";
}

}  // namespace
}  // namespace minipd_int8
