// Drawing the next token from logits. Two implementations of one rule:
// cpu::sample_row (cpu_kernels.hpp), a loop over a row in host memory, and
// sample_rows below, ATen operations that run on the logits' own device, so
// that a GPU step moves only the sampled tokens to the host, never the logits.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "areal/messages/records.hpp"

namespace areal::kernels {

struct sampled_token {
  int64_t token = 0;
  float logprob = 0;  // under the full tempered distribution, not the truncated one
};

/// The uniform in [0, 1) a sampled token is drawn with: 53 random bits of the
/// request's own generator (a CPU generator, whatever the device).
double draw_uniform(at::Generator& generator);

/// One token per row of `logits` [rows, vocab] (any float type, any device):
/// row i is drawn under params[i] with uniforms[i] in [0, 1) (unused when
/// greedy). The rule is cpu::sample_row's: greedy takes the first largest
/// logit; otherwise the draw walks the token ids in order, or with top-k/top-p
/// the candidates most probable first (ties by lower id), and stops where the
/// running mass passes uniform × kept mass. The one host transfer is the
/// result. Throws std::runtime_error when a row holds NaN or infinite logits.
std::vector<sampled_token> sample_rows(const at::Tensor& logits, const std::vector<const sampling_params*>& params,
                                       const std::vector<double>& uniforms);

}  // namespace areal::kernels
