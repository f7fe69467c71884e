// cpu::decode_attention (cpu_kernels.hpp): one query token per sequence
// against its cache, one task per (sequence, kv head). A step's prompt tokens
// take it too, each a query whose keys end at its position (model_decode.cpp).
//
// Why blocked: a key row's dot product with a query is a few vector FMAs and
// then a horizontal sum of the vector's lanes, and the horizontal sum is most of
// the work (at head_dim 64, 4 FMAs and 8 shuffles and adds). The vector path
// takes the keys a vector's width W at a time: W lane-wise partial sums, then
// one transposing reduction (log2(W) rounds of two-source shuffles and adds)
// turns them into W scores at once. The weighted values keep each query's
// output in registers across all keys instead of loading and storing it per key.
// Measured at batch 64, 4 kv heads, groups of 2, head_dim 64, 117 keys (the
// `small` preset; AMD EPYC, AVX-512, 2 threads; a probe, not kept): 0.79 ms a
// layer row by row, 0.23-0.25 ms blocked (without forced unrolling GCC kept the
// W partial sums and the outputs in memory: 0.39-0.41 ms).
#include "cpu_kernels.hpp"
#include "cpu_balanced.hpp"
#include "cpu_vectors.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace areal::kernels::cpu {

namespace {

AREAL_INLINE float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i)
    s += a[i] * b[i];
  return s;
}

AREAL_INLINE void axpy(float* y, float w, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    y[i] += w * x[i];
}

// Where task (b, h)'s keys and values lie: `shared` rows of the prompt pool,
// then the sequence's own rows [shared, length) of its cache slot.
struct task_rows {
  int64_t shared, length;
  const float *q, *pool_k, *pool_v, *own_k, *own_v;
  float* out;
};

AREAL_INLINE task_rows rows_of(const decode_attention_args& a, int64_t b, int64_t h) {
  auto d = a.head_dim;
  task_rows r;
  r.shared = a.shared[b];
  r.length = a.length[b];
  auto q_stride = a.q_stride > 0 ? a.q_stride : a.kv_heads * a.group * d;
  r.q = a.q + b * q_stride + h * a.group * d;
  r.out = a.out + (b * a.kv_heads + h) * a.group * d;
  r.pool_k = r.shared > 0 ? a.pool_keys + (h * a.pool_len + a.shared_at[b]) * d : nullptr;
  r.pool_v = r.shared > 0 ? a.pool_values + (h * a.pool_len + a.shared_at[b]) * d : nullptr;
  r.own_k = a.keys + (a.slot[b] * a.kv_heads + h) * a.max_len * d;
  r.own_v = a.values + (a.slot[b] * a.kv_heads + h) * a.max_len * d;
  return r;
}

// scores[g * length + j] = softmax over j, in place, for every group member g.
AREAL_INLINE void softmax_rows(float* scores, int64_t groups, int64_t length) {
  for (int64_t g = 0; g < groups; ++g) {
    float* s = scores + g * length;
    float top = s[0];
    for (int64_t j = 1; j < length; ++j)
      top = std::max(top, s[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < length; ++j) {
      s[j] = exp_nonpositive(s[j] - top);
      sum += s[j];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < length; ++j)
      s[j] *= inv;
  }
}

// Any head_dim: one dot product per (key, group member), one axpy per (key, member).
AREAL_INLINE void attend_rowwise(const decode_attention_args& a, int64_t b, int64_t h, float* scores) {
  auto d = a.head_dim, groups = a.group;
  auto r = rows_of(a, b, h);
  auto key_row = [&](int64_t j) { return j < r.shared ? r.pool_k + j * d : r.own_k + j * d; };
  auto value_row = [&](int64_t j) { return j < r.shared ? r.pool_v + j * d : r.own_v + j * d; };
  for (int64_t j = 0; j < r.length; ++j) {
    const float* k = key_row(j);
    for (int64_t g = 0; g < groups; ++g)
      scores[g * r.length + j] = dot(r.q + g * d, k, d) * a.scale;
  }
  softmax_rows(scores, groups, r.length);
  std::fill(r.out, r.out + groups * d, 0.0f);
  for (int64_t j = 0; j < r.length; ++j) {
    const float* v = value_row(j);
    for (int64_t g = 0; g < groups; ++g)
      axpy(r.out + g * d, scores[g * r.length + j], v, d);
  }
}

// -- The blocked path, for head_dim a multiple of the vector width W.

// Lane i of the result is the sum of v[i]'s lanes. Each round adds two
// shuffles of a pair, halving the lanes each vector's partial sums take, in
// order: after the last round lane i holds all of v[i].
AREAL_INLINE f32x16 lane_sums(const f32x16* v) {
  f32x16 w[8], x[4], y[2];
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i)
    w[i] =
        __builtin_shuffle(v[2 * i], v[2 * i + 1], i32x16{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
        __builtin_shuffle(v[2 * i], v[2 * i + 1], i32x16{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
#pragma GCC unroll 16
  for (int i = 0; i < 4; ++i)
    x[i] =
        __builtin_shuffle(w[2 * i], w[2 * i + 1], i32x16{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
        __builtin_shuffle(w[2 * i], w[2 * i + 1], i32x16{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
#pragma GCC unroll 16
  for (int i = 0; i < 2; ++i)
    y[i] =
        __builtin_shuffle(x[2 * i], x[2 * i + 1], i32x16{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}) +
        __builtin_shuffle(x[2 * i], x[2 * i + 1], i32x16{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31});
  return __builtin_shuffle(y[0], y[1], i32x16{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}) +
         __builtin_shuffle(y[0], y[1], i32x16{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
}

AREAL_INLINE f32x8 lane_sums(const f32x8* v) {
  f32x8 w[4], x[2];
#pragma GCC unroll 16
  for (int i = 0; i < 4; ++i)
    w[i] = __builtin_shuffle(v[2 * i], v[2 * i + 1], i32x8{0, 1, 2, 3, 8, 9, 10, 11}) +
           __builtin_shuffle(v[2 * i], v[2 * i + 1], i32x8{4, 5, 6, 7, 12, 13, 14, 15});
#pragma GCC unroll 16
  for (int i = 0; i < 2; ++i)
    x[i] = __builtin_shuffle(w[2 * i], w[2 * i + 1], i32x8{0, 1, 4, 5, 8, 9, 12, 13}) +
           __builtin_shuffle(w[2 * i], w[2 * i + 1], i32x8{2, 3, 6, 7, 10, 11, 14, 15});
  return __builtin_shuffle(x[0], x[1], i32x8{0, 2, 4, 6, 8, 10, 12, 14}) +
         __builtin_shuffle(x[0], x[1], i32x8{1, 3, 5, 7, 9, 11, 13, 15});
}

// scores[j] = scale * q . keys[j] for n contiguous key rows of C vectors each.
template <typename V, int C>
AREAL_INLINE void score_span(const float* q, const float* keys, int64_t n, float scale, float* scores) {
  constexpr int W = width<V>;
  constexpr int64_t d = W * C;
  V qv[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c)
    qv[c] = load<V>(q + c * W);
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    V partial[W];
#pragma GCC unroll 16
    for (int k = 0; k < W; ++k) {
      const float* row = keys + (j + k) * d;
      V s = qv[0] * load<V>(row);
#pragma GCC unroll 16
      for (int c = 1; c < C; ++c)
        s += qv[c] * load<V>(row + c * W);
      partial[k] = s;
    }
    store(scores + j, lane_sums(partial) * scale);
  }
  for (; j < n; ++j)
    scores[j] = dot(q, keys + j * d, d) * scale;
}

// out[g] += sum over j of p[g * stride + j] * values[j], for G consecutive group
// members; the G outputs stay in registers over all n rows.
template <typename V, int C, int G>
AREAL_INLINE void weigh_span(const float* p, int64_t stride, const float* values, int64_t n, V (&acc)[G][C]) {
  constexpr int W = width<V>;
  for (int64_t j = 0; j < n; ++j) {
    V v[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
      v[c] = load<V>(values + j * W * C + c * W);
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      float w = p[g * stride + j];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c)
        acc[g][c] += w * v[c];
    }
  }
}

template <typename V, int C, int G>
AREAL_INLINE void weigh_members(const task_rows& r, const float* scores, int64_t first) {
  constexpr int W = width<V>;
  constexpr int64_t d = W * C;
  V acc[G][C] = {};
  const float* p = scores + first * r.length;
  weigh_span<V, C, G>(p, r.length, r.pool_v, r.shared, acc);
  weigh_span<V, C, G>(p + r.shared, r.length, r.own_v + r.shared * d, r.length - r.shared, acc);
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
      store(r.out + (first + g) * d + c * W, acc[g][c]);
}

// Registers: the weighing keeps G * C output vectors and C value vectors; at
// most half the register file for the outputs.
template <typename V, int C>
constexpr int members_at_once = std::max(1, std::min(4, (width<V> == 16 ? 16 : 8) / C));

template <typename V, int C>
AREAL_INLINE void attend_blocked(const decode_attention_args& a, int64_t b, int64_t h, float* scores) {
  constexpr int64_t d = width<V> * C;
  auto groups = a.group;
  auto r = rows_of(a, b, h);
  for (int64_t g = 0; g < groups; ++g) {
    float* s = scores + g * r.length;
    score_span<V, C>(r.q + g * d, r.pool_k, r.shared, a.scale, s);
    score_span<V, C>(r.q + g * d, r.own_k + r.shared * d, r.length - r.shared, a.scale, s + r.shared);
  }
  softmax_rows(scores, groups, r.length);
  constexpr int G = members_at_once<V, C>;
  int64_t g = 0;
  for (; g + G <= groups; g += G)
    weigh_members<V, C, G>(r, scores, g);
  for (; g < groups; ++g)
    weigh_members<V, C, 1>(r, scores, g);
}

// head_dim = W * C for C in 1..8 takes the blocked path, anything else the row-wise one.
template <typename V>
AREAL_INLINE void attend_any(const decode_attention_args& a, int64_t b, int64_t h, float* scores) {
  constexpr int W = width<V>;
  if (a.head_dim % W == 0) {
    switch (a.head_dim / W) {
      case 1:
        return attend_blocked<V, 1>(a, b, h, scores);
      case 2:
        return attend_blocked<V, 2>(a, b, h, scores);
      case 3:
        return attend_blocked<V, 3>(a, b, h, scores);
      case 4:
        return attend_blocked<V, 4>(a, b, h, scores);
      case 5:
        return attend_blocked<V, 5>(a, b, h, scores);
      case 6:
        return attend_blocked<V, 6>(a, b, h, scores);
      case 7:
        return attend_blocked<V, 7>(a, b, h, scores);
      case 8:
        return attend_blocked<V, 8>(a, b, h, scores);
      default:
        break;
    }
  }
  attend_rowwise(a, b, h, scores);
}

// x [head_dim] rotated in place by one row's angles: Hugging Face's rotate-half.
AREAL_INLINE void rotate_half_in_place(float* x, const float* c, const float* sn, int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    float first = x[i], second = x[i + half];  // each i reads and writes only i and i + half
    x[i] = first * c[i] - second * sn[i];
    x[i + half] = second * c[i + half] + first * sn[i + half];
  }
}

// decode_attention_args::append's first part of task (b, h): its query heads
// and key rotated, key and value written to the slot's new row.
AREAL_INLINE void append_task(const decode_attention_args& a, int64_t b, int64_t h) {
  auto& f = a.append;
  auto d = a.head_dim, half = d / 2, heads = a.kv_heads * a.group;
  float* row = f.qkv + b * a.q_stride;
  const float *c = f.cos + b * d, *sn = f.sin + b * d;
  for (int64_t g = 0; g < a.group; ++g)
    rotate_half_in_place(row + (h * a.group + g) * d, c, sn, half);
  float* key = row + (heads + h) * d;
  rotate_half_in_place(key, c, sn, half);
  auto at = ((a.slot[b] * a.kv_heads + h) * a.max_len + a.length[b] - 1) * d;
  std::memcpy(f.keys + at, key, static_cast<size_t>(d) * sizeof(float));
  std::memcpy(f.values + at, row + (heads + a.kv_heads + h) * d, static_cast<size_t>(d) * sizeof(float));
}

void attend_baseline(const decode_attention_args& a, int64_t b, int64_t h, float* s) {
  if (a.append.qkv)
    append_task(a, b, h);
  attend_rowwise(a, b, h, s);
}
AREAL_AVX2 void attend_avx2(const decode_attention_args& a, int64_t b, int64_t h, float* s) {
  if (a.append.qkv)
    append_task(a, b, h);
  attend_any<f32x8>(a, b, h, s);
}
AREAL_AVX512 void attend_avx512(const decode_attention_args& a, int64_t b, int64_t h, float* s) {
  if (a.append.qkv)
    append_task(a, b, h);
  attend_any<f32x16>(a, b, h, s);
}

}  // namespace

void decode_attention(const decode_attention_args& a) {
  auto tasks = a.batch * a.kv_heads;
  auto body = [&](int64_t begin, int64_t end, int64_t) {
    denormals_flushed flushed;
    thread_local std::vector<float> scores;
    for (int64_t t = begin; t < end; ++t) {
      auto b = t / a.kv_heads, h = t % a.kv_heads;
      auto need = static_cast<size_t>(a.group * a.length[b]);
      if (scores.size() < need)
        scores.resize(need);
      switch (cpu_isa) {
        case isa::avx512:
          attend_avx512(a, b, h, scores.data());
          break;
        case isa::avx2:
          attend_avx2(a, b, h, scores.data());
          break;
        default:
          attend_baseline(a, b, h, scores.data());
      }
    }
  };
  balanced_for(tasks, 1, body);  // tasks cost what their sequence's length costs
}

void write_cache_rows(float* dst, const int64_t* rows, int64_t count, const float* src, int64_t src_stride,
                      int64_t heads, int64_t head_dim) {
  auto bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t r = 0; r < count; ++r)
    std::memcpy(dst + rows[r] * head_dim, src + (r / heads) * src_stride + (r % heads) * head_dim, bytes);
}

}  // namespace areal::kernels::cpu
