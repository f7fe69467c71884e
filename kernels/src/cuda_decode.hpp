// The decode step's fused CUDA kernels (cuda/decode_kernels.cu) on ATen
// tensors, for a steady decode step on a GPU: nine kernels a layer instead of
// some forty (policy_model::decode_steady). Built only against a LibTorch with
// CUDA (AREAL_CUDA_KERNELS); elsewhere available() is false.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace areal::kernels::cuda_decode {

/// Whether this build has the kernels.
bool available();
/// Switched off, the step runs op by op (bench_device's comparison). On by default.
void set_enabled(bool on);
bool enabled();

/// Whether the kernels serve a step whose activations and cache are like `x`
/// and `cache_keys`: on by build and switch, on a CUDA device, float32 or
/// bfloat16 alike, head_dim even and at most 128, no gradient recorded.
bool applies(const at::Tensor& x, const at::Tensor& cache_keys, int64_t head_dim);

/// With `delta` defined, x += delta in place; returns rms_norm(x) * weight.
at::Tensor add_rms_norm(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);

/// q of qkv rotated ([tokens, q_width]); rotated k and v of qkv written into the
/// caches' rows viewed as [rows, head_dim] (cache_rows [tokens * kv_heads]).
at::Tensor rotary_to_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& cache_rows, at::Tensor& cache_keys, at::Tensor& cache_values,
                           int64_t q_width, int64_t kv_width, int64_t head_dim);

/// Row b of q [batch, heads * head_dim] against cache slot b's keys and values
/// at positions 0..positions[b] -> [batch, heads * head_dim].
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& cache_keys, const at::Tensor& cache_values,
                            const at::Tensor& positions, int64_t heads, double scale);

/// gate_up [tokens, 2 inter] -> silu(gate) * up [tokens, inter].
at::Tensor swiglu(const at::Tensor& gate_up);

/// Whether the fused sampler serves `logits`: on by build and switch, a CUDA
/// [rows, vocab] tensor of float32 or bfloat16.
bool sampler_applies(const at::Tensor& logits);

/// sample_rows (sampling.hpp) for rows with no top-k or top-p cut, in one
/// kernel: params [rows, columns] float64 on the logits' device, holding each
/// row's inverse temperature, greedy flag (1 or 0) and uniform at the columns
/// named -> [rows, 3] float64 on the device: token, log-probability, 1 where
/// every logit of the row is finite.
at::Tensor sample_plain(const at::Tensor& logits, const at::Tensor& params, int64_t inv_temperature_column,
                        int64_t greedy_column, int64_t uniform_column);

}  // namespace areal::kernels::cuda_decode
