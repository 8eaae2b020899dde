// Causal attention of a prefill chunk over a paged KV pool, float32, for x86 CPUs with AVX2 and
// FMA (built into the same library as vnni_kernels.cpp; registered as MINIPD_OPS::prefill_attention).
//
// Why not torch's SDPA: on the CPU its flash kernel splits keys in blocks of 512, so a causal
// chunk of up to 512 tokens computes (and then masks) every score of its square, twice the work
// attention needs; and the paged path first gathers the chunk's K/V blocks into one tensor.
// Here each query row reads only the keys it sees, straight from the pool's blocks.
//
// q [T, heads, head_dim] (rows may be strided, e.g. a view of the fused q/k/v output), the
// layer's pool [num_blocks, 2, block_size, kv_heads, head_dim] (index 0 of dim 1 K, 1 V),
// block_ids: the sequence's blocks in order, context_len: tokens in the cache including the
// chunk's own (already written). Query t of the chunk is at position context_len - T + t and
// sees keys 0 .. that position (grouped-query: head h reads kv head h / (heads / kv_heads)).
// Returns [T, heads, head_dim] float32: softmax(scale * q k^T) v, computed with a running max
// and sum over blocks of 64 keys (exp by a polynomial, within 2 ulp of expf), so it is close to
// but not bit-equal to SDPA's; a row depends on that row's query and its keys only.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "avx2_math.h"

#ifndef MINIPD_OPS
#error "build with -DMINIPD_OPS=<the ops' namespace> (vnni_kernels.py does)"
#endif

namespace {
using namespace minipd_avx2_math;

constexpr int64_t kKeys = 16;      // keys per score micro-tile: two float32 vectors
constexpr int64_t kKeyBlock = 64;  // keys per online-softmax step
constexpr int64_t kDims = 16;      // head dims per P.V micro-tile
constexpr int64_t kMaxRows = 6;    // query rows per tile: 12 accumulators + 3 operands in 16 registers

// One kv head's keys, transposed per group of 16 ([padded / 16][head_dim][16]: a micro-tile's keys
// in one contiguous run, not 64 rows a power of two apart that share a few cache sets), and its
// values ([padded][head_dim]); zero past context_len, so micro-tiles never read past the end.
struct PackedKV {
  std::vector<float> kt, v;
  int64_t padded;
};

PackedKV pack_head(const float* pool, const int64_t* blocks, int64_t block_size, int64_t kv_heads, int64_t d,
                   int64_t g, int64_t context_len) {
  const int64_t padded = (context_len + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
  PackedKV p{std::vector<float>(d * padded, 0.0f), std::vector<float>(padded * d, 0.0f), padded};
  const int64_t row = kv_heads * d;  // floats per token slot of one K (or V) block
  for (int64_t j = 0; j < context_len; ++j) {
    const float* k = pool + (blocks[j / block_size] * 2 * block_size + j % block_size) * row + g * d;
    const float* v = k + block_size * row;
    float* kt = p.kt.data() + (j / kKeys) * d * kKeys + j % kKeys;
    for (int64_t e = 0; e < d; ++e) kt[e * kKeys] = k[e];
    std::copy(v, v + d, p.v.data() + j * d);
  }
  return p;
}

// s[r][0..16) = q_r . k_{j0 + i} for R rows.
template <int R>
void scores(const float* const* q, const PackedKV& kv, int64_t d, int64_t j0, float* s) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* kt = kv.kt.data() + j0 * d;  // j0 is a multiple of kKeys
  for (int64_t e = 0; e < d; ++e, kt += kKeys) {
    const __m256 k0 = _mm256_loadu_ps(kt), k1 = _mm256_loadu_ps(kt + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 qe = _mm256_broadcast_ss(q[r] + e);
      acc[r][0] = _mm256_fmadd_ps(qe, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(qe, k1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * kKeyBlock, acc[r][0]);
    _mm256_storeu_ps(s + r * kKeyBlock + 8, acc[r][1]);
  }
}

// o[r][e0..e0+16) = alpha[r] * o[r][..] + sum_j p[r][j] v_{j0 + j}[..], j < n.
template <int R>
void accumulate(float* o, int64_t d, const float* alpha, const float* p, const PackedKV& kv, int64_t j0, int64_t n,
                int64_t e0) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
    acc[r][0] = _mm256_mul_ps(a, _mm256_loadu_ps(o + r * d + e0));
    acc[r][1] = _mm256_mul_ps(a, _mm256_loadu_ps(o + r * d + e0 + 8));
  }
  const float* v = kv.v.data() + j0 * d + e0;
  for (int64_t j = 0; j < n; ++j, v += d) {
    const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 pj = _mm256_broadcast_ss(p + r * kKeyBlock + j);
      acc[r][0] = _mm256_fmadd_ps(pj, v0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(pj, v1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(o + r * d + e0, acc[r][0]);
    _mm256_storeu_ps(o + r * d + e0 + 8, acc[r][1]);
  }
}

// Rows of one tile: query rows sharing a kv head, each with its last visible key.
struct Tile {
  const float* q[kMaxRows];
  float* out[kMaxRows];
  int64_t last[kMaxRows];
  int rows;
};

template <int R>
void attend(const Tile& t, const PackedKV& kv, int64_t d, float scale) {
  alignas(32) float s[R * kKeyBlock];
  std::vector<float> o(R * d, 0.0f);
  float m[R], l[R], alpha[R];
  for (int r = 0; r < R; ++r) m[r] = -std::numeric_limits<float>::infinity(), l[r] = 0.0f;
  const int64_t end = *std::max_element(t.last, t.last + R) + 1;
  for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, end - j0);
    for (int64_t i = 0; i < n; i += kKeys) scores<R>(t.q, kv, d, j0 + i, s + i);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 minus_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int r = 0; r < R; ++r) {
      float* sr = s + r * kKeyBlock;
      // Keys past the row's last (or past n, whose scores were not computed) get -inf.
      const __m256i last = _mm256_set1_epi32(static_cast<int32_t>(std::min(t.last[r] - j0, n - 1)));
      __m256 block_max = minus_inf;
      for (int64_t j = 0; j < kKeyBlock; j += 8) {
        const __m256i key = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(j)));
        const __m256 hidden = _mm256_castsi256_ps(_mm256_cmpgt_epi32(key, last));
        const __m256 v = _mm256_blendv_ps(_mm256_loadu_ps(sr + j), minus_inf, hidden);
        _mm256_storeu_ps(sr + j, v);
        block_max = _mm256_max_ps(block_max, v);
      }
      const float m_new = std::max(m[r], lanes_max(block_max));
      if (m_new == -std::numeric_limits<float>::infinity()) {  // sees no key yet (not so for a causal row)
        alpha[r] = 1.0f;
        std::fill(sr, sr + kKeyBlock, 0.0f);
        continue;
      }
      alpha[r] = m[r] == m_new ? 1.0f : std::exp(scale * (m[r] - m_new));  // 0 for the first block it sees
      const __m256 mv = _mm256_set1_ps(m_new), sv = _mm256_set1_ps(scale);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t j = 0; j < kKeyBlock; j += 8) {
        const __m256 p = exp_nonpositive(_mm256_mul_ps(sv, _mm256_sub_ps(_mm256_loadu_ps(sr + j), mv)));
        _mm256_storeu_ps(sr + j, p);
        sum = _mm256_add_ps(sum, p);
      }
      l[r] = l[r] * alpha[r] + lanes_sum(sum);
      m[r] = m_new;
    }
    for (int64_t e0 = 0; e0 < d; e0 += kDims) accumulate<R>(o.data(), d, alpha, s, kv, j0, n, e0);
  }
  for (int r = 0; r < R; ++r) {
    const float inv = 1.0f / l[r];
    for (int64_t e = 0; e < d; ++e) t.out[r][e] = o[r * d + e] * inv;
  }
}

void attend_any(const Tile& t, const PackedKV& kv, int64_t d, float scale) {
  switch (t.rows) {
    case 1: return attend<1>(t, kv, d, scale);
    case 2: return attend<2>(t, kv, d, scale);
    case 3: return attend<3>(t, kv, d, scale);
    case 4: return attend<4>(t, kv, d, scale);
    case 5: return attend<5>(t, kv, d, scale);
    default: return attend<6>(t, kv, d, scale);
  }
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& layer_kv, const at::Tensor& block_ids_in,
                             int64_t context_len, double scale) {
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kFloat && q.dim() == 3 && q.stride(2) == 1 &&
                  q.stride(1) == q.size(2),
              "minipd prefill_attention: q must be a float32 CPU tensor [T, heads, head_dim] with contiguous heads");
  TORCH_CHECK(layer_kv.device().is_cpu() && layer_kv.scalar_type() == at::kFloat && layer_kv.dim() == 5 &&
                  layer_kv.size(1) == 2 && layer_kv.size(4) == q.size(2) && layer_kv.is_contiguous(),
              "minipd prefill_attention: the pool must be a contiguous float32 CPU tensor "
              "[blocks, 2, block_size, kv_heads, head_dim] with q's head_dim");
  const int64_t T = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t block_size = layer_kv.size(2), kv_heads = layer_kv.size(3);
  TORCH_CHECK(d % kDims == 0, "minipd prefill_attention: head_dim must be a multiple of ", kDims, ", got ", d);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "minipd prefill_attention: ", heads,
              " heads cannot share ", kv_heads, " kv heads");
  TORCH_CHECK(context_len >= T, "minipd prefill_attention: context_len ", context_len, " is below the chunk's ", T,
              " tokens");
  const at::Tensor block_ids = block_ids_in.to(at::kLong).contiguous();
  TORCH_CHECK(block_ids.numel() * block_size >= context_len, "minipd prefill_attention: ", block_ids.numel(),
              " blocks of ", block_size, " cannot hold ", context_len, " tokens");
  const int64_t* blocks = block_ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < block_ids.numel(); ++b)
    TORCH_CHECK(blocks[b] >= 0 && blocks[b] < layer_kv.size(0), "minipd prefill_attention: block id ", blocks[b],
                " is not in the pool of ", layer_kv.size(0));
  at::Tensor out = at::empty({T, heads, d}, q.options().memory_format(at::MemoryFormat::Contiguous));
  if (T == 0) return out;
  const int64_t group = heads / kv_heads, prefix = context_len - T;
  // Tiles: up to kMaxRows (position, head) rows of one kv head, positions in order.
  const int64_t rows_per_head = T * group;
  const int64_t tiles_per_head = (rows_per_head + kMaxRows - 1) / kMaxRows;
  const float* pool = layer_kv.data_ptr<float>();
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t q_row = q.stride(0);
  for (int64_t g = 0; g < kv_heads; ++g) {  // one head's K/V packed at a time: they stay in cache
    const PackedKV kv = pack_head(pool, blocks, block_size, kv_heads, d, g, context_len);
    at::parallel_for(0, tiles_per_head, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t ti = t0; ti < t1; ++ti) {
        Tile tile{};
        for (int64_t i = ti * kMaxRows; i < std::min(rows_per_head, (ti + 1) * kMaxRows); ++i) {
          const int64_t pos = i / group, h = g * group + i % group;
          tile.q[tile.rows] = qp + pos * q_row + h * d;
          tile.out[tile.rows] = op + (pos * heads + h) * d;
          tile.last[tile.rows] = prefix + pos;
          ++tile.rows;
        }
        attend_any(tile, kv, d, static_cast<float>(scale));
      }
    });
  }
  return out;
}

}  // namespace

#define MINIPD_TORCH_LIBRARY_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
MINIPD_TORCH_LIBRARY_FRAGMENT(MINIPD_OPS, m) {
  m.def("prefill_attention(Tensor q, Tensor layer_kv, Tensor block_ids, int context_len, float scale) -> Tensor");
  m.impl("prefill_attention", c10::kCPU, &prefill_attention);
}
