// The element-wise layers and the causal attention of the policy model as
// single autograd nodes over the loops of cpu_train_kernels.hpp: one pass
// forward and one backward where ATen's composition runs several of each (and
// allocates a temporary for every one). policy_model uses them where they
// apply and ATen elsewhere.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace areal::kernels::fused {

/// Whether the fused loops serve this tensor: float32 on the CPU, while enabled.
bool applies(const at::Tensor& t);

/// Turns the CPU's own loops on (the default) or off process-wide: these fused
/// layers and the engine's sampling loop (cpu::sample_row). Off, a CPU run takes
/// the ATen path every other device takes; the tests and benchmarks compare them.
void set_enabled(bool on);
bool enabled();

/// RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps) * weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// silu(gate) * up, where gate_up [T, 2 I] holds gate then up: [T, I].
at::Tensor swiglu(const at::Tensor& gate_up);

/// Rotary embedding of the first `rotated` columns of x [T, width] (heads of
/// head_dim columns; the rest, e.g. the values of a fused qkv row, copied),
/// by angles cos, sin [T, head_dim].
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotated, int64_t head_dim);

/// at::linear(x, w, b) for x [T, in]. When applies(x), grad mode is on, and w
/// (and b) are leaves with a gradient buffer (a trainable policy_model's
/// views into flat_grad), the backward adds their gradients into those
/// buffers in place and returns none for them to autograd; otherwise at::linear.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

/// Whether causal_attention serves these rows: applies(qkv) and a head size the loops take (a multiple of 8).
bool attention_applies(const at::Tensor& qkv, int64_t head_dim);

/// Causal attention of packed sequences (sequence s: rows cu_seqlens[s] ..
/// cu_seqlens[s + 1]) over fused rows qkv [T, (heads + 2 kv_heads) * head_dim]
/// (q and k already rotated), scaled by 1 / sqrt(head_dim): [T, heads * head_dim].
/// Each query sees only the keys up to its own position; the backward
/// recomputes the probabilities from each query's saved log-sum-exp and
/// returns the gradient of the fused rows in one tensor. `parents` (empty, or
/// one per sequence): a sequence whose parent p is not -1 continues sequence p
/// (its queries see all of p's keys before their own; cpu::causal_attention_args).
at::Tensor causal_attention(const at::Tensor& qkv, const std::vector<int64_t>& cu_seqlens, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, const std::vector<int64_t>& parents = {});

}  // namespace areal::kernels::fused
