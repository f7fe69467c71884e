// cpu::causal_attention_forward / _backward (cpu_train_kernels.hpp): the causal
// attention of a packed training micro-batch, one task per (sequence, kv head).
//
// Why by hand: ATen's composition (a masked score product per sequence over all
// L x L pairs, softmax, a second product, and each one's backward, with the
// split of q, k and v and its concatenation backward) took 15-16% of the PPO
// step's CPU time on the `small` preset at 256 tokens a sequence (`perf`),
// for 2% of its model FLOPs. Here each query meets only the keys it may see
// (half the pairs), scores and probabilities of a block of queries stay in
// cache, the backward recomputes the probabilities from the saved
// log-sum-exp (flash-attention style: no [heads, L, L] tensor kept for the
// backward), and the gradient of q, k and v is written straight into the fused
// qkv rows.
//
// Blocking: queries go Q = 4 at a time. The scores of a block are a product
// with the keys transposed ([head_dim, L], two key vectors per step, 8
// accumulators); the weighted sums keep the block's outputs in registers over
// all keys; the key and value gradients take each key row once per block and
// add the block's 4 contributions in registers.
#include "cpu_balanced.hpp"
#include "cpu_train_kernels.hpp"
#include "cpu_vectors.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace areal::kernels::cpu {

namespace {

constexpr int Q = 4;  // queries per block

// Vectors of a head's row the weighted sums keep per query at once: at most
// half the register file for the block's 4 outputs (32 registers with
// AVX-512, 16 otherwise).
template <typename V>
constexpr int chunk = width<V> == 16 ? 4 : 2;

AREAL_INLINE int64_t round_up(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}

// s[qq * lp + i] = qb[qq] . kt[:, i] for the block's Q rows and keys i < n
// (rounded up to 2W; kt [d, lp] is zero past the sequence's keys).
template <typename V>
AREAL_INLINE void scores_block(const float* qb, const float* kt, int64_t lp, int64_t d, int64_t n, float* s) {
  constexpr int W = width<V>;
  for (int64_t i = 0; i < n; i += 2 * W) {
    V acc[Q][2] = {};
#pragma GCC unroll 4
    for (int64_t c = 0; c < d; ++c) {
      V k0 = load<V>(kt + c * lp + i), k1 = load<V>(kt + c * lp + i + W);
#pragma GCC unroll 4
      for (int qq = 0; qq < Q; ++qq) {
        float x = qb[qq * d + c];
        acc[qq][0] += x * k0;
        acc[qq][1] += x * k1;
      }
    }
#pragma GCC unroll 4
    for (int qq = 0; qq < Q; ++qq) {
      store(s + qq * lp + i, acc[qq][0]);
      store(s + qq * lp + i + W, acc[qq][1]);
    }
  }
}

// out[qq, c0 .. c0 + CB W) = sum over i < n of p[qq * lp + i] * rows[i * stride + c0 ..].
template <typename V, int CB>
AREAL_INLINE void weigh_chunk(const float* p, int64_t lp, const float* rows, int64_t stride, int64_t n, int64_t c0,
                              int64_t d, float* out) {
  constexpr int W = width<V>;
  V acc[Q][CB] = {};
  for (int64_t i = 0; i < n; ++i) {
    V r[CB];
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c)
      r[c] = load<V>(rows + i * stride + c0 + c * W);
#pragma GCC unroll 4
    for (int qq = 0; qq < Q; ++qq) {
      float w = p[qq * lp + i];
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c)
        acc[qq][c] += w * r[c];
    }
  }
#pragma GCC unroll 4
  for (int qq = 0; qq < Q; ++qq)
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c)
      store(out + qq * d + c0 + c * W, acc[qq][c]);
}

// out [Q, d] = p [Q, n] x rows [n, d] (row i at rows + i * stride).
template <typename V>
AREAL_INLINE void weigh(const float* p, int64_t lp, const float* rows, int64_t stride, int64_t n, int64_t d,
                        float* out) {
  constexpr int W = width<V>, CB = chunk<V>;
  int64_t c0 = 0;
  for (; c0 + CB * W <= d; c0 += CB * W)
    weigh_chunk<V, CB>(p, lp, rows, stride, n, c0, d, out);
  for (; c0 < d; c0 += W)
    weigh_chunk<V, 1>(p, lp, rows, stride, n, c0, d, out);
}

// acc[i, c0 .. c0 + CB W) += sum over the block's qq of coef[qq * lp + i] * x[qq, c0 ..], for i < n.
template <typename V, int CB>
AREAL_INLINE void spread_chunk(const float* coef, int64_t lp, const float* x, int64_t n, int64_t c0, int64_t d,
                               float* acc) {
  constexpr int W = width<V>;
  V xv[Q][CB];
#pragma GCC unroll 4
  for (int qq = 0; qq < Q; ++qq)
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c)
      xv[qq][c] = load<V>(x + qq * d + c0 + c * W);
  for (int64_t i = 0; i < n; ++i) {
    float w[Q];
#pragma GCC unroll 4
    for (int qq = 0; qq < Q; ++qq)
      w[qq] = coef[qq * lp + i];
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) {
      float* row = acc + i * d + c0 + c * W;
      V a = load<V>(row);
#pragma GCC unroll 4
      for (int qq = 0; qq < Q; ++qq)
        a += w[qq] * xv[qq][c];
      store(row, a);
    }
  }
}

// acc [n, d] += coef [Q, n]^T x [Q, d].
template <typename V>
AREAL_INLINE void spread(const float* coef, int64_t lp, const float* x, int64_t n, int64_t d, float* acc) {
  constexpr int W = width<V>, CB = chunk<V>;
  int64_t c0 = 0;
  for (; c0 + CB * W <= d; c0 += CB * W)
    spread_chunk<V, CB>(coef, lp, x, n, c0, d, acc);
  for (; c0 < d; c0 += W)
    spread_chunk<V, 1>(coef, lp, x, n, c0, d, acc);
}

// Where task (sequence, kv head)'s rows lie in the fused qkv rows. Keys 0 ..
// prefix - 1 are the parent's rows (from prefix_first), keys prefix .. the
// sequence's own; queries are the sequence's own rows only.
struct task {
  const causal_attention_args& a;
  int64_t first, length, kv_head;
  int64_t prefix_first = 0, prefix = 0;

  int64_t group() const { return a.heads / a.kv_heads; }
  int64_t out_width() const { return a.heads * a.head_dim; }
  int64_t keys() const { return prefix + length; }
  int64_t key_row(int64_t i) const { return i < prefix ? prefix_first + i : first + i - prefix; }
  const float* key(int64_t i) const { return a.qkv + key_row(i) * a.row + (a.heads + kv_head) * a.head_dim; }
  const float* value(int64_t i) const {
    return a.qkv + key_row(i) * a.row + (a.heads + a.kv_heads + kv_head) * a.head_dim;
  }
  const float* query(int64_t t, int64_t h) const { return a.qkv + (first + t) * a.row + h * a.head_dim; }
};

// dst [d, lp]: the rows transposed, zero past `length`. In tiles of 16 rows:
// row by row, every store of a row went to another cache line (a fifth of
// the backward's time at 256 tokens, `perf annotate`).
template <typename F>
AREAL_INLINE void transpose_rows(F row, int64_t length, int64_t d, int64_t lp, float* dst) {
  constexpr int64_t tile = 16;
  for (int64_t c = 0; c < d; ++c)
    std::fill(dst + c * lp + length, dst + (c + 1) * lp, 0.0f);
  for (int64_t i0 = 0; i0 < length; i0 += tile) {
    auto rows = std::min(tile, length - i0);
    const float* r[tile];
    for (int64_t i = 0; i < rows; ++i)
      r[i] = row(i0 + i);
    for (int64_t c = 0; c < d; ++c)
      for (int64_t i = 0; i < rows; ++i)
        dst[c * lp + i0 + i] = r[i][c];
  }
}

// The block's rows of `row(t)` (times `scale`) into qb [Q, d], zero past the
// sequence; the next block's rows are fetched meanwhile (these rows are far
// apart in memory and out of cache: their loads were most of the gathers' time).
template <typename F>
AREAL_INLINE void gather_block(F row, int64_t t0, int64_t length, int64_t d, float scale, float* qb) {
  for (int qq = 0; qq < Q; ++qq) {
    float* dst = qb + qq * d;
    if (t0 + qq >= length) {
      std::fill(dst, dst + d, 0.0f);
      continue;
    }
    if (t0 + qq + Q < length)
      for (int64_t c = 0; c < d; c += 16)
        __builtin_prefetch(row(t0 + qq + Q) + c);
    const float* src = row(t0 + qq);
#pragma omp simd
    for (int64_t c = 0; c < d; ++c)
      dst[c] = src[c] * scale;
  }
}

struct buffers {
  std::vector<float> kt, vt, s, dp, qb, ob, dk, dv, kc, vc;

  void size_for(int64_t length, int64_t d, int64_t lp) {
    auto grow = [](std::vector<float>& v, int64_t n) {
      if (v.size() < static_cast<size_t>(n))
        v.resize(static_cast<size_t>(n));
    };
    grow(kt, d * lp);
    grow(vt, d * lp);
    grow(s, Q * lp);
    grow(dp, Q * lp);
    grow(qb, Q * d);
    grow(ob, Q * d);
    grow(dk, length * d);
    grow(dv, length * d);
  }
};

// The task's key (or value) rows as one strided array: in place without a
// prefix, else gathered into `scratch` ([keys, d], stride d).
template <typename F>
std::pair<const float*, int64_t> rows_of(const task& k, F row, std::vector<float>& scratch) {
  auto d = k.a.head_dim;
  if (k.prefix == 0)
    return {row(0), k.a.row};
  if (scratch.size() < static_cast<size_t>(k.keys() * d))
    scratch.resize(static_cast<size_t>(k.keys() * d));
  for (int64_t i = 0; i < k.keys(); ++i)
    std::copy(row(i), row(i) + d, scratch.data() + i * d);
  return {scratch.data(), d};
}

template <typename V>
AREAL_INLINE void forward_task(const task& k, buffers& b) {
  auto& a = k.a;
  auto d = a.head_dim, length = k.length, prefix = k.prefix, keys = k.keys();
  auto lp = round_up(keys, 2 * width<V>);
  b.size_for(keys, d, lp);
  transpose_rows([&](int64_t i) { return k.key(i); }, keys, d, lp, b.kt.data());
  auto [values, value_stride] = rows_of(
      k, [&](int64_t i) { return k.value(i); }, b.vc);
  for (int64_t g = 0; g < k.group(); ++g) {
    auto h = k.kv_head * k.group() + g;
    for (int64_t t0 = 0; t0 < length; t0 += Q) {
      auto n = prefix + std::min(t0 + Q, length);  // the keys the block's queries see
      gather_block([&](int64_t t) { return k.query(t, h); }, t0, length, d, a.scale, b.qb.data());
      scores_block<V>(b.qb.data(), b.kt.data(), lp, d, n, b.s.data());
      for (int qq = 0; qq < Q; ++qq) {
        float* p = b.s.data() + qq * lp;
        auto t = t0 + qq;
        if (t >= length) {
          std::fill(p, p + n, 0.0f);
          continue;
        }
        auto last = prefix + t;  // the last key query t sees
        float top = p[0];
#pragma omp simd reduction(max : top)
        for (int64_t i = 1; i <= last; ++i)
          top = p[i] > top ? p[i] : top;
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i <= last; ++i) {
          p[i] = exp_nonpositive(p[i] - top);
          sum += p[i];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t i = 0; i <= last; ++i)
          p[i] *= inv;
        std::fill(p + last + 1, p + n, 0.0f);
        a.lse[(k.first + t) * a.heads + h] = top + std::log(sum);
      }
      weigh<V>(b.s.data(), lp, values, value_stride, n, d, b.ob.data());
      for (int qq = 0; qq < Q && t0 + qq < length; ++qq)
        std::copy(b.ob.data() + qq * d, b.ob.data() + (qq + 1) * d,
                  a.out + (k.first + t0 + qq) * k.out_width() + h * d);
    }
  }
}

template <typename V>
AREAL_INLINE void backward_task(const task& k, const float* d_out, const float* delta_rows, float* d_qkv, buffers& b) {
  auto& a = k.a;
  auto d = a.head_dim, length = k.length, prefix = k.prefix, keys = k.keys();
  auto lp = round_up(keys, 2 * width<V>);
  b.size_for(keys, d, lp);
  transpose_rows([&](int64_t i) { return k.key(i); }, keys, d, lp, b.kt.data());
  transpose_rows([&](int64_t i) { return k.value(i); }, keys, d, lp, b.vt.data());
  auto [key_rows, key_stride] = rows_of(
      k, [&](int64_t i) { return k.key(i); }, b.kc);
  std::fill(b.dk.begin(), b.dk.begin() + keys * d, 0.0f);
  std::fill(b.dv.begin(), b.dv.begin() + keys * d, 0.0f);
  float* dob = b.ob.data();  // the block's output gradient rows
  for (int64_t g = 0; g < k.group(); ++g) {
    auto h = k.kv_head * k.group() + g;
    auto out_row = [&](const float* base, int64_t t) { return base + (k.first + t) * k.out_width() + h * d; };
    for (int64_t t0 = 0; t0 < length; t0 += Q) {
      auto n = prefix + std::min(t0 + Q, length);
      gather_block([&](int64_t t) { return k.query(t, h); }, t0, length, d, a.scale, b.qb.data());
      gather_block([&](int64_t t) { return out_row(d_out, t); }, t0, length, d, 1.0f, dob);
      scores_block<V>(b.qb.data(), b.kt.data(), lp, d, n, b.s.data());  // scaled scores
      scores_block<V>(dob, b.vt.data(), lp, d, n, b.dp.data());         // dP = dO V^T
      for (int qq = 0; qq < Q; ++qq) {
        float* p = b.s.data() + qq * lp;
        float* ds = b.dp.data() + qq * lp;
        auto t = t0 + qq;
        if (t >= length) {
          std::fill(p, p + n, 0.0f);
          std::fill(ds, ds + n, 0.0f);
          continue;
        }
        auto last = prefix + t;
        float lse = a.lse[(k.first + t) * a.heads + h];
        float delta = delta_rows[(k.first + t) * a.heads + h];
#pragma omp simd
        for (int64_t i = 0; i <= last; ++i) {
          p[i] = exp_nonpositive(p[i] - lse);
          ds[i] = p[i] * (ds[i] - delta);
        }
        std::fill(p + last + 1, p + n, 0.0f);
        std::fill(ds + last + 1, ds + n, 0.0f);
      }
      // In this order: dob is read by the spread of dV before dS K overwrites it.
      spread<V>(b.dp.data(), lp, b.qb.data(), n, d, b.dk.data());  // dK += dS^T (scale Q)
      spread<V>(b.s.data(), lp, dob, n, d, b.dv.data());           // dV += P^T dO
      weigh<V>(b.dp.data(), lp, key_rows, key_stride, n, d, dob);  // dS K; dQ = scale dS K
      for (int qq = 0; qq < Q && t0 + qq < length; ++qq) {
        float* dst = d_qkv + (k.first + t0 + qq) * a.row + h * d;
        const float* src = dob + qq * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c)
          dst[c] = src[c] * a.scale;
      }
    }
  }
  // The own rows' key and value gradients are written; the parent's are added
  // to what its own task (run before, in the same family task) wrote there.
  for (int64_t i = 0; i < keys; ++i) {
    float* dk = d_qkv + k.key_row(i) * a.row + (a.heads + k.kv_head) * d;
    float* dv = d_qkv + k.key_row(i) * a.row + (a.heads + a.kv_heads + k.kv_head) * d;
    const float* sk = b.dk.data() + i * d;
    const float* sv = b.dv.data() + i * d;
    if (i >= prefix) {
      std::copy(sk, sk + d, dk);
      std::copy(sv, sv + d, dv);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) {
        dk[c] += sk[c];
        dv[c] += sv[c];
      }
    }
  }
}

void forward_baseline(const task& k, buffers& b) {
  forward_task<f32x8>(k, b);
}
AREAL_AVX2 void forward_avx2(const task& k, buffers& b) {
  forward_task<f32x8>(k, b);
}
AREAL_AVX512 void forward_avx512(const task& k, buffers& b) {
  forward_task<f32x16>(k, b);
}
void backward_baseline(const task& k, const float* d_out, const float* delta, float* d_qkv, buffers& b) {
  backward_task<f32x8>(k, d_out, delta, d_qkv, b);
}
AREAL_AVX2 void backward_avx2(const task& k, const float* d_out, const float* delta, float* d_qkv, buffers& b) {
  backward_task<f32x8>(k, d_out, delta, d_qkv, b);
}
AREAL_AVX512 void backward_avx512(const task& k, const float* d_out, const float* delta, float* d_qkv, buffers& b) {
  backward_task<f32x16>(k, d_out, delta, d_qkv, b);
}

bool avx512_width(int64_t head_dim) {
  return cpu_isa == isa::avx512 && head_dim % 16 == 0;
}

// Runs body(task) for every (sequence, kv head) with a non-empty sequence, on ATen's intra-op threads: a
// family (a sequence and those that continue it, in order) on one thread, so that a child's key and value
// gradients are added to its parent's after the parent's own and never by two threads at once. A task costs
// what its sequence's length squared costs: balanced_for, not an even split by count.
template <typename F>
void for_tasks(const causal_attention_args& a, F body) {
  std::vector<std::vector<int64_t>> families;  // sequence indices, the parent first
  std::vector<int64_t> family_of(static_cast<size_t>(a.sequences), -1);
  for (int64_t s = 0; s < a.sequences; ++s) {
    auto parent = a.parents ? a.parents[s] : -1;
    if (parent < 0) {
      family_of[static_cast<size_t>(s)] = static_cast<int64_t>(families.size());
      families.push_back({s});
    } else {
      families[static_cast<size_t>(family_of[static_cast<size_t>(parent)])].push_back(s);
    }
  }
  auto count = static_cast<int64_t>(families.size()) * a.kv_heads;
  balanced_for(count, 1, [&](int64_t begin, int64_t end, int64_t) {
    denormals_flushed flushed;
    thread_local buffers b;
    for (int64_t t = begin; t < end; ++t) {
      auto& family = families[static_cast<size_t>(t / a.kv_heads)];
      auto root = family.front();
      for (auto s : family) {
        auto first = a.cu_seqlens[s], length = a.cu_seqlens[s + 1] - first;
        if (length == 0)
          continue;
        task k{a, first, length, t % a.kv_heads};
        if (s != root) {
          k.prefix_first = a.cu_seqlens[root];
          k.prefix = a.cu_seqlens[root + 1] - k.prefix_first;
        }
        body(k, b);
      }
    }
  });
}

}  // namespace

std::string check_parents(const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& parents) {
  auto sequences = cu_seqlens.empty() ? 0 : cu_seqlens.size() - 1;
  if (parents.size() != sequences)
    return std::to_string(parents.size()) + " parents for " + std::to_string(sequences) + " sequences";
  for (size_t s = 0; s < parents.size(); ++s) {
    auto p = parents[s];
    if (p < -1 || p >= static_cast<int64_t>(s))
      return "sequence " + std::to_string(s) + " continues " + std::to_string(p) +
             ": a parent is -1 or an earlier sequence";
    if (p >= 0 && parents[static_cast<size_t>(p)] != -1)
      return "sequence " + std::to_string(s) + " continues " + std::to_string(p) + ", which continues another";
  }
  return {};
}

bool causal_attention_supported(int64_t head_dim) {
  return head_dim > 0 && head_dim % 8 == 0;
}

void causal_attention_forward(const causal_attention_args& a) {
  for_tasks(a, [&](const task& k, buffers& b) {
    if (avx512_width(a.head_dim))
      return forward_avx512(k, b);
    if (cpu_isa != isa::baseline)
      return forward_avx2(k, b);
    forward_baseline(k, b);
  });
}

void causal_attention_backward(const causal_attention_args& a, const float* d_out, const float* delta, float* d_qkv) {
  for_tasks(a, [&](const task& k, buffers& b) {
    if (avx512_width(a.head_dim))
      return backward_avx512(k, d_out, delta, d_qkv, b);
    if (cpu_isa != isa::baseline)
      return backward_avx2(k, d_out, delta, d_qkv, b);
    backward_baseline(k, d_out, delta, d_qkv, b);
  });
}

}  // namespace areal::kernels::cpu
