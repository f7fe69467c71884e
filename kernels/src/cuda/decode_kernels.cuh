// The decode step's fused CUDA kernels, with a plain interface (raw pointers,
// a stream): nvcc compiles decode_kernels.cu without LibTorch's headers, and
// cuda_decode.cpp is the ATen side. Each kernel rounds where the op-by-op path
// it replaces rounds (bfloat16 results of each elementwise op), except the
// attention, which keeps scores and sums in float32 throughout.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace areal::kernels::cuda_launch {

enum class element { f32, bf16 };

/// Per row of [rows, width]: with `delta`, x += delta (x updated in place); then
/// out = rms_norm(x) * weight (statistics in float32).
void add_rms_norm(element type, void* x, const void* delta, const void* weight, void* out, int64_t rows, int64_t width,
                  float eps, cudaStream_t stream);

/// qkv [tokens, q_width + 2 kv_width]: q and k rotated by cos, sin [tokens, head_dim]
/// (rotate-half), q into q_out [tokens, q_width], k and v into the caches' rows
/// (cache_rows[token * kv_heads + head], rows of head_dim elements).
void rotary_to_cache(element type, const void* qkv, const void* cos, const void* sin, const int64_t* cache_rows,
                     void* q_out, void* cache_keys, void* cache_values, int64_t tokens, int64_t q_width,
                     int64_t kv_width, int64_t head_dim, cudaStream_t stream);

/// Row b of q [batch, heads * head_dim] attends to the keys and values of cache
/// slot b ([slots, kv_heads, max_len, head_dim]) at positions 0..positions[b].
/// head_dim at most 128.
void decode_attention(element type, const void* q, const void* cache_keys, const void* cache_values,
                      const int64_t* positions, void* out, int64_t batch, int64_t heads, int64_t kv_heads,
                      int64_t max_len, int64_t head_dim, float scale, cudaStream_t stream);

/// gate_up [tokens, 2 inter] (gate, then up) -> out [tokens, inter] = silu(gate) * up.
void swiglu(element type, const void* gate_up, void* out, int64_t tokens, int64_t inter, cudaStream_t stream);

/// Per row of logits [rows, vocab], with params [rows, columns] in float64 (the
/// row's inverse temperature, greedy flag and uniform at the columns named):
/// out [rows, 3] in float64 = the token (the first largest logit when greedy,
/// else the first whose running sum of exp(logit * inverse temperature - max)
/// passes uniform * total), its log-probability under the tempered
/// distribution, and 1 where every logit is finite (0 otherwise).
void sample_plain(element type, const void* logits, const double* params, int64_t columns, int64_t inv_temperature,
                  int64_t greedy, int64_t uniform, double* out, int64_t rows, int64_t vocab, cudaStream_t stream);

/// The last launch's error as text, or empty.
const char* last_error();

}  // namespace areal::kernels::cuda_launch
