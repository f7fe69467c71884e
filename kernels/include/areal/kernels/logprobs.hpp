// Log-probabilities of chosen tokens without materializing [tokens x vocab].
//
//   logp[t] = log_softmax(hidden[t] . W^T / temperature)[target[t]]
//
// The forward pass runs over chunks of tokens sized so that one chunk's logits
// stay under `max_chunk_elements`, keeping only the per-token log-sum-exp; the
// backward pass recomputes each chunk's logits. Peak memory is one chunk, not
// the whole [tokens x vocab] matrix (which for Qwen2's 151,936-token vocabulary
// is the usual out-of-memory in peer systems). This is the default path.
#pragma once

#include <ATen/ATen.h>

namespace areal::kernels {

/// hidden [T, H], weight [V, H], targets [T] (int64) -> logp [T] (float32),
/// differentiable with respect to hidden and weight. The logits are computed in
/// `compute` precision (float32 or bfloat16), in the backward pass too.
at::Tensor chunked_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                  double temperature = 1.0, int64_t max_chunk_elements = int64_t{1} << 26,
                                  at::ScalarType compute = at::kFloat);

/// The plain formula with the full [T, V] log-softmax: the reference for tests and benchmarks.
at::Tensor naive_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                double temperature = 1.0);

}  // namespace areal::kernels
