#include "decode_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

namespace areal::kernels::cuda_launch {

namespace {

// Loads and stores in float; round() is what storing and loading back gives.
template <typename T>
struct io;
template <>
struct io<float> {
  static __device__ float load(const float* p) { return *p; }
  static __device__ void store(float* p, float v) { *p = v; }
  static __device__ float round(float v) { return v; }
};
template <>
struct io<__nv_bfloat16> {
  static __device__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static __device__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
  static __device__ float round(float v) { return __bfloat162float(__float2bfloat16(v)); }
};

constexpr int block_threads = 128;

// The sum (or maximum) over the block, returned to every thread. Every thread must call it.
template <bool maximum>
__device__ float block_reduce(float v) {
  __shared__ float partial[block_threads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = maximum ? fmaxf(v, other) : v + other;
  }
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // a previous call's readers are done with partial
  if (lane == 0)
    partial[warp] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < block_threads / 32; ++w)
    v = maximum ? fmaxf(v, partial[w]) : v + partial[w];
  return v;
}

template <typename T>
__global__ void add_rms_norm_kernel(T* x, const T* delta, const T* weight, T* out, int64_t width, float eps) {
  T* row = x + blockIdx.x * width;
  const T* add = delta ? delta + blockIdx.x * width : nullptr;
  float squares = 0;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    float v = io<T>::load(row + c);
    if (add) {
      v = io<T>::round(v + io<T>::load(add + c));
      io<T>::store(row + c, v);
    }
    squares += v * v;
  }
  float inverse = rsqrtf(block_reduce<false>(squares) / static_cast<float>(width) + eps);
  T* normed = out + blockIdx.x * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
    io<T>::store(normed + c, io<T>::round(io<T>::load(row + c) * inverse) * io<T>::load(weight + c));
}

template <typename T>
__global__ void rotary_to_cache_kernel(const T* qkv, const T* cos, const T* sin, const int64_t* cache_rows, T* q_out,
                                       T* cache_keys, T* cache_values, int64_t tokens, int64_t q_width,
                                       int64_t kv_width, int64_t head_dim) {
  int64_t width = q_width + 2 * kv_width;
  int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= tokens * width)
    return;
  int64_t t = index / width, c = index % width, kv_heads = kv_width / head_dim;
  const T* row = qkv + t * width;
  if (c >= q_width + kv_width) {  // v: copied
    int64_t v = c - q_width - kv_width;
    io<T>::store(cache_values + cache_rows[t * kv_heads + v / head_dim] * head_dim + v % head_dim,
                 io<T>::load(row + c));
    return;
  }
  int64_t i = c % head_dim, half = head_dim / 2, head_start = c - i;
  float partner = i < half ? -io<T>::load(row + head_start + i + half) : io<T>::load(row + head_start + i - half);
  float rotated = io<T>::round(io<T>::round(io<T>::load(row + c) * io<T>::load(cos + t * head_dim + i)) +
                               io<T>::round(partner * io<T>::load(sin + t * head_dim + i)));
  if (c < q_width) {
    io<T>::store(q_out + t * q_width + c, rotated);
  } else {
    int64_t k = c - q_width;
    io<T>::store(cache_keys + cache_rows[t * kv_heads + k / head_dim] * head_dim + i, rotated);
  }
}

// One block per (row, head): scores of a tile of keys in shared memory, an
// online softmax across tiles; thread i accumulates output dimension i.
constexpr int attention_tile = 1024;

template <typename T>
__global__ void decode_attention_kernel(const T* q, const T* cache_keys, const T* cache_values,
                                        const int64_t* positions, T* out, int64_t heads, int64_t kv_heads,
                                        int64_t max_len, int64_t head_dim, float scale) {
  __shared__ float query[block_threads];
  __shared__ float weights[attention_tile];
  int64_t b = blockIdx.x / heads, h = blockIdx.x % heads, kv = h / (heads / kv_heads);
  int64_t length = positions[b] + 1;
  int tid = threadIdx.x;
  if (tid < head_dim)
    query[tid] = io<T>::load(q + (b * heads + h) * head_dim + tid);
  __syncthreads();
  const T* keys = cache_keys + (b * kv_heads + kv) * max_len * head_dim;
  const T* values = cache_values + (b * kv_heads + kv) * max_len * head_dim;
  float running_max = -INFINITY, running_sum = 0, acc = 0;
  for (int64_t start = 0; start < length; start += attention_tile) {
    int64_t n = min(static_cast<int64_t>(attention_tile), length - start);
    float tile_max = -INFINITY;
    for (int64_t j = tid; j < n; j += blockDim.x) {
      const T* key = keys + (start + j) * head_dim;
      float dot = 0;
      for (int64_t i = 0; i < head_dim; ++i)
        dot += query[i] * io<T>::load(key + i);
      weights[j] = dot * scale;
      tile_max = fmaxf(tile_max, dot * scale);
    }
    float new_max = fmaxf(running_max, block_reduce<true>(tile_max));
    float kept = expf(running_max - new_max);  // 0 on the first tile
    float tile_sum = 0;
    for (int64_t j = tid; j < n; j += blockDim.x) {
      float e = expf(weights[j] - new_max);
      weights[j] = e;
      tile_sum += e;
    }
    running_sum = running_sum * kept + block_reduce<false>(tile_sum);  // its barriers publish weights
    if (tid < head_dim) {
      float a = acc * kept;
      for (int64_t j = 0; j < n; ++j)
        a += weights[j] * io<T>::load(values + (start + j) * head_dim + tid);
      acc = a;
    }
    running_max = new_max;
    __syncthreads();  // the next tile overwrites weights
  }
  if (tid < head_dim)
    io<T>::store(out + (b * heads + h) * head_dim + tid, acc / running_sum);
}

template <typename T>
__global__ void swiglu_kernel(const T* gate_up, T* out, int64_t tokens, int64_t inter) {
  int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= tokens * inter)
    return;
  int64_t t = index / inter, c = index % inter;
  float gate = io<T>::load(gate_up + t * 2 * inter + c), up = io<T>::load(gate_up + t * 2 * inter + inter + c);
  io<T>::store(out + index, io<T>::round(gate / (1.0f + expf(-gate))) * up);
}

// Sampling: one block per row, each thread over a contiguous chunk of the
// vocabulary, three passes over the row (maximum, sums, the crossing) and no
// buffer of the vocabulary's size. The sums are float64 like the op-by-op
// path's (sampling.cpp), so a draw differs from it only where a uniform falls
// within rounding of a boundary between two tokens.
constexpr int sample_threads = 512;

template <typename T>
__global__ void sample_plain_kernel(const T* logits, const double* params, int64_t columns, int64_t inv_temperature,
                                    int64_t greedy, int64_t uniform, double* out, int64_t vocab) {
  __shared__ float top_of[sample_threads], best_of[sample_threads];
  __shared__ int64_t index_of[sample_threads];
  __shared__ double sum_of[sample_threads];
  __shared__ int finite_of[sample_threads];
  const T* row = logits + blockIdx.x * vocab;
  const double* p = params + blockIdx.x * columns;
  float inverse = static_cast<float>(p[inv_temperature]);
  int tid = threadIdx.x;
  int64_t chunk = (vocab + sample_threads - 1) / sample_threads;
  int64_t begin = min(vocab, tid * chunk), end = min(vocab, begin + chunk);

  // Pass 1: the largest tempered logit, the first largest logit, finiteness.
  float top = -INFINITY, best = -INFINITY;
  int64_t best_at = vocab;
  int finite = 1;
  for (int64_t i = begin; i < end; ++i) {
    float x = io<T>::load(row + i);
    finite &= isfinite(x) ? 1 : 0;
    top = fmaxf(top, x * inverse);
    if (x > best || best_at == vocab) {
      best = x;
      best_at = i;
    }
  }
  top_of[tid] = top, best_of[tid] = best, index_of[tid] = best_at, finite_of[tid] = finite;
  __syncthreads();
  for (int half = sample_threads / 2; half > 0; half /= 2) {
    if (tid < half) {
      int o = tid + half;
      top_of[tid] = fmaxf(top_of[tid], top_of[o]);
      finite_of[tid] &= finite_of[o];
      // Equal values keep the lower index (after the first halving a lower
      // entry may hold a later chunk's index).
      bool other_wins = index_of[o] != vocab && (index_of[tid] == vocab || best_of[o] > best_of[tid] ||
                                                 (best_of[o] == best_of[tid] && index_of[o] < index_of[tid]));
      if (other_wins) {
        best_of[tid] = best_of[o];
        index_of[tid] = index_of[o];
      }
    }
    __syncthreads();
  }
  top = top_of[0];
  int64_t argmax = index_of[0];
  bool all_finite = finite_of[0] != 0;
  __syncthreads();  // index_of is reused below

  // Pass 2: each chunk's sum of the weights, then their inclusive running sums.
  double own = 0;
  for (int64_t i = begin; i < end; ++i)
    own += static_cast<double>(expf(io<T>::load(row + i) * inverse - top));
  sum_of[tid] = own;
  __syncthreads();
  for (int offset = 1; offset < sample_threads; offset *= 2) {
    double earlier = tid >= offset ? sum_of[tid - offset] : 0.0;
    __syncthreads();
    sum_of[tid] += earlier;
    __syncthreads();
  }
  double total = sum_of[sample_threads - 1];
  double before = tid > 0 ? sum_of[tid - 1] : 0.0;

  // Pass 3: the first token whose running sum passes uniform * total. A chunk
  // that starts past it offers its first token; the chunk it falls in walks.
  double target = p[uniform] * total;
  int64_t found = vocab;
  if (begin < end) {
    if (before > target) {
      found = begin;
    } else if (sum_of[tid] > target) {
      double running = before;
      for (int64_t i = begin; i < end; ++i) {
        running += static_cast<double>(expf(io<T>::load(row + i) * inverse - top));
        if (running > target) {
          found = i;
          break;
        }
      }
    }
  }
  index_of[tid] = found;
  __syncthreads();
  for (int half = sample_threads / 2; half > 0; half /= 2) {
    if (tid < half)
      index_of[tid] = min(index_of[tid], index_of[tid + half]);
    __syncthreads();
  }
  if (tid == 0) {
    int64_t drawn = min(index_of[0], vocab - 1);
    int64_t token = p[greedy] > 0.5 ? argmax : drawn;
    if (token >= vocab)  // no finite logit at all: any token, the row is refused
      token = 0;
    double* r = out + blockIdx.x * 3;
    r[0] = static_cast<double>(token);
    r[1] = static_cast<double>(io<T>::load(row + token) * inverse) - static_cast<double>(top) - log(total);
    r[2] = all_finite ? 1.0 : 0.0;
  }
}

unsigned blocks_for(int64_t items, int threads) {
  return static_cast<unsigned>((items + threads - 1) / threads);
}

}  // namespace

void add_rms_norm(element type, void* x, const void* delta, const void* weight, void* out, int64_t rows, int64_t width,
                  float eps, cudaStream_t stream) {
  if (type == element::f32)
    add_rms_norm_kernel<<<static_cast<unsigned>(rows), block_threads, 0, stream>>>(
        static_cast<float*>(x), static_cast<const float*>(delta), static_cast<const float*>(weight),
        static_cast<float*>(out), width, eps);
  else
    add_rms_norm_kernel<<<static_cast<unsigned>(rows), block_threads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(delta),
        static_cast<const __nv_bfloat16*>(weight), static_cast<__nv_bfloat16*>(out), width, eps);
}

void rotary_to_cache(element type, const void* qkv, const void* cos, const void* sin, const int64_t* cache_rows,
                     void* q_out, void* cache_keys, void* cache_values, int64_t tokens, int64_t q_width,
                     int64_t kv_width, int64_t head_dim, cudaStream_t stream) {
  constexpr int threads = 256;
  auto blocks = blocks_for(tokens * (q_width + 2 * kv_width), threads);
  if (type == element::f32)
    rotary_to_cache_kernel<<<blocks, threads, 0, stream>>>(
        static_cast<const float*>(qkv), static_cast<const float*>(cos), static_cast<const float*>(sin), cache_rows,
        static_cast<float*>(q_out), static_cast<float*>(cache_keys), static_cast<float*>(cache_values), tokens, q_width,
        kv_width, head_dim);
  else
    rotary_to_cache_kernel<<<blocks, threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(qkv), static_cast<const __nv_bfloat16*>(cos),
        static_cast<const __nv_bfloat16*>(sin), cache_rows, static_cast<__nv_bfloat16*>(q_out),
        static_cast<__nv_bfloat16*>(cache_keys), static_cast<__nv_bfloat16*>(cache_values), tokens, q_width, kv_width,
        head_dim);
}

void decode_attention(element type, const void* q, const void* cache_keys, const void* cache_values,
                      const int64_t* positions, void* out, int64_t batch, int64_t heads, int64_t kv_heads,
                      int64_t max_len, int64_t head_dim, float scale, cudaStream_t stream) {
  auto blocks = static_cast<unsigned>(batch * heads);
  if (type == element::f32)
    decode_attention_kernel<<<blocks, block_threads, 0, stream>>>(
        static_cast<const float*>(q), static_cast<const float*>(cache_keys), static_cast<const float*>(cache_values),
        positions, static_cast<float*>(out), heads, kv_heads, max_len, head_dim, scale);
  else
    decode_attention_kernel<<<blocks, block_threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(cache_keys),
        static_cast<const __nv_bfloat16*>(cache_values), positions, static_cast<__nv_bfloat16*>(out), heads, kv_heads,
        max_len, head_dim, scale);
}

void swiglu(element type, const void* gate_up, void* out, int64_t tokens, int64_t inter, cudaStream_t stream) {
  constexpr int threads = 256;
  auto blocks = blocks_for(tokens * inter, threads);
  if (type == element::f32)
    swiglu_kernel<<<blocks, threads, 0, stream>>>(static_cast<const float*>(gate_up), static_cast<float*>(out), tokens,
                                                  inter);
  else
    swiglu_kernel<<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(gate_up),
                                                  static_cast<__nv_bfloat16*>(out), tokens, inter);
}

void sample_plain(element type, const void* logits, const double* params, int64_t columns, int64_t inv_temperature,
                  int64_t greedy, int64_t uniform, double* out, int64_t rows, int64_t vocab, cudaStream_t stream) {
  auto blocks = static_cast<unsigned>(rows);
  if (type == element::f32)
    sample_plain_kernel<<<blocks, sample_threads, 0, stream>>>(static_cast<const float*>(logits), params, columns,
                                                               inv_temperature, greedy, uniform, out, vocab);
  else
    sample_plain_kernel<<<blocks, sample_threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(logits), params,
                                                               columns, inv_temperature, greedy, uniform, out, vocab);
}

const char* last_error() {
  auto error = cudaGetLastError();
  return error == cudaSuccess ? "" : cudaGetErrorString(error);
}

}  // namespace areal::kernels::cuda_launch
