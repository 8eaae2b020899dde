// One decode step of a Llama or Qwen2 model with every projection and the lm_head in GGUF's blocks
// (minipd's int8 kernels in any of their formats, block_matmul.h), as one op: `MINIPD_OPS::decode_step`. It computes in
// float32 whatever the model's dtype; the KV pool is float32 or bfloat16 (the model's), its new
// rows rounded to nearest even in bfloat16, as the eager path's .to() rounds them.
//
// Why: the eager step is ~30 torch ops a layer around the four matmuls (norms, rotary, the KV
// write, the gathers and SDPA of paged attention, SiLU, residual adds); at one row each costs
// more in dispatch than in arithmetic, ~10 ms a step for SmolLM2 on one core against ~11 ms of
// matmuls. Here each row's step is plain loops between direct calls of the matmul kernels.
//
// What it computes, per row r (a sequence's single new token at position p = positions[r]),
// layer by layer, all in float32 (the norms and rotary tables given in float32):
//   h = rms_norm(x) * w_in                     (sum of squares in float32 on 8 lanes, then the lanes pairwise)
//   q, k, v = h @ W_qkv (int8 kernel) + b_qkv (Qwen2's biases, where given); q, k rotated: x * cos[p] + roll(x, d / 2) * signed_sin[p]
//   K/V of position p written to the pool at block_tables[r][p / block_size], offset p % block_size
//   o = softmax(scale * q . K[0..p]) . V[0..p] per head (kv head = head / (heads / kv_heads)),
//       the maximum subtracted first, exp on 8 lanes (Cephes' polynomial, ~2 ulp)
//   x += o @ W_o;  h = rms_norm(x) * w_post;  g, u = h @ W_gate_up;  x += (silu(g) * u) @ W_down
// then logits = rms_norm(x) * w_final @ W_lm_head (any format). Each weight is its segments
// (formats, outs: block_matmul.h), `segments[i]` of them for packed[i]. A row's result depends on
// its own token, position, block table and cached K/V only: not on the other rows, their number
// or the threads. It is not bit-equal to the eager path's (other summation orders, another exp):
// an engine uses one of the two for every decode row, so a row is computed alike wherever it runs.
//
// The caller (models/kernel_steps/fused_decode.py) checks the model's shapes; this op checks every index it
// is given (positions against the tables and the pool, block ids against the pool).

#include <cmath>

#include "avx2_math.h"
#include "block_matmul.h"

#ifndef MINIPD_OPS
#error "build with -DMINIPD_OPS=<the ops' namespace> (vnni_kernels.py does)"
#endif

namespace {
using namespace minipd_int8;
using minipd_avx2_math::exp8;
using minipd_avx2_math::lanes_sum;  // lanes added in a fixed order: halves, then pairs, then the last two

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {  // bfloat16 is float32's top half: exact
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// K/V rows into the pool: float32 as they are, bfloat16 rounded to nearest even (as .to() rounds).
inline void store_row(float* dst, const float* src, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
inline void store_row(at::BFloat16* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = at::BFloat16(src[i]);
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {  // n a multiple of 8
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc);
  return lanes_sum(acc);
}

void rms_norm(const float* x, const float* w, int64_t rows, int64_t H, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * H;
    const float inv = 1.0f / std::sqrt(dot(xr, xr, H) / static_cast<float>(H) + eps);
    for (int64_t i = 0; i < H; ++i) out[r * H + i] = w[i] * (xr[i] * inv);
  }
}

void rotate(float* v, const float* cos, const float* signed_sin, int64_t D) {  // one head, in place
  alignas(32) float rotated[512];
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) rotated[i] = v[i] * cos[i] + v[(i + half) % D] * signed_sin[i];
  std::memcpy(v, rotated, D * sizeof(float));
}

struct Shapes {
  int64_t L, H, heads, kv_heads, D, F, V, num_blocks, block_size, max_blocks, max_pos;
};

// Attention of row r's heads of kv head g over positions [0, p]: writes out[heads / kv_heads][D].
template <typename T>
void attend(const float* q, const T* pool_layer, const int64_t* table, int64_t p, int64_t g, const Shapes& s,
            float scale, float* out, std::vector<float>& scores) {
  const int64_t rep = s.heads / s.kv_heads, n = p + 1, row = s.kv_heads * s.D;
  scores.resize(rep * n);
  auto key = [&](int64_t j, int64_t kv) {
    const int64_t block = table[j / s.block_size];
    return pool_layer + ((block * 2 + kv) * s.block_size + j % s.block_size) * row + g * s.D;
  };
  for (int64_t j = 0; j < n; ++j) {
    const T* k = key(j, 0);
    for (int64_t h = 0; h < rep; ++h) scores[h * n + j] = scale * dot(q + h * s.D, k, s.D);
  }
  for (int64_t h = 0; h < rep; ++h) {
    float* sh = scores.data() + h * n;
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, sh[j]);
    __m256 total = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + j), _mm256_set1_ps(m)));
      _mm256_storeu_ps(sh + j, e);
      total = _mm256_add_ps(total, e);
    }
    if (j < n) {  // the tail through the same lanes, the lanes past it zero
      alignas(32) float tail[8] = {};
      for (int64_t t = 0; j + t < n; ++t) tail[t] = sh[j + t] - m;
      _mm256_store_ps(tail, exp8(_mm256_load_ps(tail)));
      for (int64_t t = 0; t < 8; ++t) {
        if (j + t < n)
          sh[j + t] = tail[t];
        else
          tail[t] = 0.0f;
      }
      total = _mm256_add_ps(total, _mm256_load_ps(tail));
    }
    const float inv = 1.0f / lanes_sum(total);
    float* o = out + h * s.D;
    for (int64_t i0 = 0; i0 < s.D; i0 += 64) {  // 64 outputs at a time in 8 registers
      const int64_t lanes = std::min<int64_t>(64, s.D - i0) / 8;
      __m256 acc[8];
      for (int64_t i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t jj = 0; jj < n; ++jj) {
        const T* v = key(jj, 1) + i0;
        const __m256 pj = _mm256_set1_ps(sh[jj] * inv);
        if (lanes == 8) {
          for (int64_t i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(pj, load8(v + 8 * i), acc[i]);
        } else {
          for (int64_t i = 0; i < lanes; ++i) acc[i] = _mm256_fmadd_ps(pj, load8(v + 8 * i), acc[i]);
        }
      }
      for (int64_t i = 0; i < lanes; ++i) _mm256_storeu_ps(o + i0 + 8 * i, acc[i]);
    }
  }
}

// One projection slot: its packed segments (block_matmul.h), checked against a [out, in] weight.
struct Slot {
  const uint8_t* w;
  const int64_t* formats;
  const int64_t* outs;
  int64_t segments;
};

Slot check_slot(const at::Tensor& w, const std::vector<int64_t>& formats, const std::vector<int64_t>& outs,
                int64_t first, int64_t count, int64_t out, int64_t in, const char* what) {
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous(), "minipd decode_step: ", what,
              " must be contiguous uint8 blocks");
  const std::vector<int64_t> f(formats.begin() + first, formats.begin() + first + count);
  const std::vector<int64_t> o(outs.begin() + first, outs.begin() + first + count);
  const std::string why = check_segments(f, o, in, w.numel());
  int64_t total = 0;
  for (const int64_t v : o) total += v;
  TORCH_CHECK(why.empty() && total == out, "minipd decode_step: ", what, " must be packed blocks for a [", out, ", ", in,
              "] weight", why.empty() ? "" : ": ", why);
  return {w.data_ptr<uint8_t>(), formats.data() + first, outs.data() + first, count};
}

void multiply(const Slot& w, const float* x, int64_t rows, int64_t in, float* y) {
  multiply_segments(w.formats, w.outs, w.segments, x, rows, in, w.w, y);
}

template <typename T>
at::Tensor run(const at::Tensor& x_in, const at::Tensor& positions_in, const at::Tensor& tables_in,
               const at::Tensor& pool, const at::Tensor& cos, const at::Tensor& signed_sin, at::TensorList norms,
               at::TensorList packed, const std::vector<int64_t>& formats, const std::vector<int64_t>& outs,
               const std::vector<int64_t>& segments, at::TensorList biases, int64_t heads, int64_t kv_heads,
               int64_t intermediate, double eps, double scale) {
  const int64_t n = x_in.size(0);
  Shapes s{pool.size(0), x_in.size(1), heads, kv_heads, pool.size(5), intermediate, 0,
           pool.size(1),  pool.size(3),  tables_in.dim() == 2 ? tables_in.size(1) : 0, cos.size(0)};
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0 && pool.size(4) == kv_heads && s.D % 8 == 0 && s.D <= 512 &&
                  s.H % kBlock == 0 && (heads * s.D) % kBlock == 0 && s.F % kBlock == 0,
              "minipd decode_step: unsupported shapes");
  TORCH_CHECK(positions_in.scalar_type() == at::kLong && positions_in.numel() == n && tables_in.scalar_type() == at::kLong &&
                  tables_in.dim() == 2 && tables_in.size(0) == n,
              "minipd decode_step: positions [rows] and block_tables [rows, max_blocks] must be int64");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && signed_sin.scalar_type() == at::kFloat && cos.dim() == 2 &&
                  cos.size(1) == s.D && signed_sin.sizes() == cos.sizes() && cos.is_contiguous() &&
                  signed_sin.is_contiguous(),
              "minipd decode_step: cos and signed_sin must be contiguous float32 [positions, d]");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == 2 * s.L + 1 && static_cast<int64_t>(packed.size()) == 4 * s.L + 1,
              "minipd decode_step: one input and one post-attention norm per layer and a final one; four packed "
              "projections per layer and the lm_head");
  TORCH_CHECK(static_cast<int64_t>(segments.size()) == 4 * s.L + 1 && formats.size() == outs.size() &&
                  static_cast<int64_t>(biases.size()) == s.L,
              "minipd decode_step: a segment count per packed weight, a format and an output count per segment, "
              "and a (possibly empty) q/k/v bias per layer");
  std::vector<int64_t> first(segments.size() + 1, 0);
  for (size_t i = 0; i < segments.size(); ++i) first[i + 1] = first[i] + segments[i];
  TORCH_CHECK(first.back() == static_cast<int64_t>(formats.size()), "minipd decode_step: segment counts do not add up");
  const int64_t qkv_out = (heads + 2 * kv_heads) * s.D;
  auto slot = [&](int64_t i, int64_t out, int64_t in, const char* what) {
    return check_slot(packed[i], formats, outs, first[i], segments[i], out, in, what);
  };
  std::vector<Slot> slots;
  for (int64_t l = 0; l < s.L; ++l) {
    slots.push_back(slot(4 * l, qkv_out, s.H, "qkv"));
    slots.push_back(slot(4 * l + 1, s.H, heads * s.D, "o"));
    slots.push_back(slot(4 * l + 2, 2 * s.F, s.H, "gate_up"));
    slots.push_back(slot(4 * l + 3, s.H, s.F, "down"));
    TORCH_CHECK(biases[l].numel() == 0 || (biases[l].scalar_type() == at::kFloat && biases[l].is_contiguous() &&
                                           biases[l].numel() == qkv_out),
                "minipd decode_step: a q/k/v bias must be empty or contiguous float32 [", qkv_out, "]");
  }
  for (int64_t i = first[4 * s.L]; i < first[4 * s.L + 1]; ++i) s.V += outs[i];
  slots.push_back(slot(4 * s.L, s.V, s.H, "lm_head"));
  for (const at::Tensor& w : norms)
    TORCH_CHECK(w.scalar_type() == at::kFloat && w.numel() == s.H && w.is_contiguous(),
                "minipd decode_step: norms must be contiguous float32 [hidden]");
  const at::Tensor positions = positions_in.contiguous(), tables = tables_in.contiguous();
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* table = tables.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] < s.max_pos && pos[r] < s.max_blocks * s.block_size,
                "minipd decode_step: position ", pos[r], " of row ", r, " is outside its block table or the rotary tables");
    for (int64_t b = 0; b <= pos[r] / s.block_size; ++b) {
      const int64_t id = table[r * s.max_blocks + b];
      TORCH_CHECK(id >= 0 && id < s.num_blocks, "minipd decode_step: block id ", id, " of row ", r, " is not in the pool");
    }
  }

  at::Tensor x = x_in.contiguous().clone();
  at::Tensor logits = at::empty({n, s.V}, x.options());
  float* xp = x.data_ptr<float>();
  const int64_t qkv_row = qkv_out, att_row = heads * s.D, kv_row = kv_heads * s.D;
  std::vector<float> h(n * s.H), qkv(n * qkv_row), att(n * att_row), o(n * s.H), gu(n * 2 * s.F), act(n * s.F);
  const int64_t layer_floats = s.num_blocks * 2 * s.block_size * kv_row;
  const float fscale = static_cast<float>(scale), feps = static_cast<float>(eps);
  auto add_into_x = [&](const std::vector<float>& y) {
    for (int64_t i = 0; i < n * s.H; ++i) xp[i] += y[i];
  };
  for (int64_t l = 0; l < s.L; ++l) {
    T* pool_layer = pool.data_ptr<T>() + l * layer_floats;
    rms_norm(xp, norms[2 * l].data_ptr<float>(), n, s.H, feps, h.data());
    multiply(slots[4 * l], h.data(), n, s.H, qkv.data());
    for (int64_t r = 0; r < n; ++r) {
      float* row = qkv.data() + r * qkv_row;
      if (biases[l].numel() != 0) {
        const float* bias = biases[l].data_ptr<float>();
        for (int64_t i = 0; i < qkv_row; ++i) row[i] += bias[i];
      }
      const float* c = cos.data_ptr<float>() + pos[r] * s.D;
      const float* sn = signed_sin.data_ptr<float>() + pos[r] * s.D;
      for (int64_t head = 0; head < heads + kv_heads; ++head) rotate(row + head * s.D, c, sn, s.D);
      const int64_t block = table[r * s.max_blocks + pos[r] / s.block_size], offset = pos[r] % s.block_size;
      store_row(pool_layer + ((block * 2 + 0) * s.block_size + offset) * kv_row, row + heads * s.D, kv_row);
      store_row(pool_layer + ((block * 2 + 1) * s.block_size + offset) * kv_row, row + (heads + kv_heads) * s.D, kv_row);
    }
    at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t r = i / kv_heads, g = i % kv_heads, rep = heads / kv_heads;
        attend(qkv.data() + r * qkv_row + g * rep * s.D, pool_layer, table + r * s.max_blocks, pos[r], g, s, fscale,
               att.data() + r * att_row + g * rep * s.D, scores);
      }
    });
    multiply(slots[4 * l + 1], att.data(), n, att_row, o.data());
    add_into_x(o);
    rms_norm(xp, norms[2 * l + 1].data_ptr<float>(), n, s.H, feps, h.data());
    multiply(slots[4 * l + 2], h.data(), n, s.H, gu.data());
    for (int64_t r = 0; r < n; ++r) {
      const float* g = gu.data() + r * 2 * s.F;
      float* a = act.data() + r * s.F;
      for (int64_t i = 0; i < s.F; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 sig = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(g + s.F + i)));
      }
    }
    multiply(slots[4 * l + 3], act.data(), n, s.F, o.data());
    add_into_x(o);
  }
  rms_norm(xp, norms[2 * s.L].data_ptr<float>(), n, s.H, feps, h.data());
  multiply(slots[4 * s.L], h.data(), n, s.H, logits.data_ptr<float>());
  return logits;
}

at::Tensor decode_step(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& tables,
                       const at::Tensor& pool, const at::Tensor& cos, const at::Tensor& signed_sin,
                       at::TensorList norms, at::TensorList packed, at::IntArrayRef formats, at::IntArrayRef outs,
                       at::IntArrayRef segments, at::TensorList biases, int64_t heads, int64_t kv_heads,
                       int64_t intermediate, double eps, double scale) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "minipd decode_step: x must be float32 [rows, hidden]");
  TORCH_CHECK((pool.scalar_type() == at::kFloat || pool.scalar_type() == at::kBFloat16) && pool.dim() == 6 &&
                  pool.is_contiguous(),
              "minipd decode_step: the KV pool must be a contiguous float32 or bfloat16 [layers, blocks, 2, block, "
              "kv_heads, d]");
  if (pool.scalar_type() == at::kFloat)
    return run<float>(x, positions, tables, pool, cos, signed_sin, norms, packed, formats.vec(), outs.vec(),
                      segments.vec(), biases, heads, kv_heads, intermediate, eps, scale);
  return run<at::BFloat16>(x, positions, tables, pool, cos, signed_sin, norms, packed, formats.vec(), outs.vec(),
                           segments.vec(), biases, heads, kv_heads, intermediate, eps, scale);
}

}  // namespace

#define MINIPD_TORCH_LIBRARY_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
MINIPD_TORCH_LIBRARY_FRAGMENT(MINIPD_OPS, m) {
  m.def(
      "decode_step(Tensor x, Tensor positions, Tensor block_tables, Tensor(a!) kv_pool, Tensor cos, "
      "Tensor signed_sin, Tensor[] norms, Tensor[] packed, int[] formats, int[] outs, int[] segments, "
      "Tensor[] biases, int heads, int kv_heads, int intermediate, float eps, float scale) -> Tensor");
  m.impl("decode_step", c10::kCPU, &decode_step);
}
