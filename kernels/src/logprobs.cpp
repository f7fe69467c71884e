#include "areal/kernels/logprobs.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>

#include "areal/kernels/precision.hpp"

namespace areal::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t chunk_rows(int64_t vocab, int64_t max_elements) {
  return std::max<int64_t>(1, max_elements / std::max<int64_t>(1, vocab));
}

// Logits of rows [begin, begin + n) in float32, divided by the temperature.
at::Tensor chunk_logits(const at::Tensor& hidden, const at::Tensor& weight, int64_t begin, int64_t n, double inv_temp) {
  return at::matmul(hidden.narrow(0, begin, n), weight.t()).to(at::kFloat).mul_(inv_temp);
}

struct chunked_logprob_function : torch::autograd::Function<chunked_logprob_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& targets, double inv_temp, int64_t max_elements, bool bf16) {
    compute_precision precision(bf16 ? at::kBFloat16 : at::kFloat);
    auto total = hidden.size(0), rows = chunk_rows(weight.size(0), max_elements);
    auto logp = at::empty({total}, hidden.options().dtype(at::kFloat));
    auto lse = at::empty({total}, hidden.options().dtype(at::kFloat));
    for (int64_t begin = 0; begin < total; begin += rows) {
      auto n = std::min(rows, total - begin);
      auto logits = chunk_logits(hidden, weight, begin, n, inv_temp);
      auto chunk_lse = at::logsumexp(logits, -1);
      lse.narrow(0, begin, n).copy_(chunk_lse);
      logp.narrow(0, begin, n).copy_(logits.gather(1, targets.narrow(0, begin, n).unsqueeze(1)).squeeze(1) - chunk_lse);
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["inv_temp"] = inv_temp;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["bf16"] = bf16;
    return logp;
  }

  // d logp_t / d logits_t = onehot(target_t) - softmax(logits_t), times 1/temperature.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto &hidden = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3];
    auto inv_temp = ctx->saved_data["inv_temp"].toDouble();
    auto rows = ctx->saved_data["rows"].toInt();
    // The logits are recomputed as the forward pass computed them (the saved log-sum-exp belongs to those).
    compute_precision precision(ctx->saved_data["bf16"].toBool() ? at::kBFloat16 : at::kFloat);
    auto grad = grads[0].to(at::kFloat);
    auto total = hidden.size(0);
    auto grad_hidden = at::zeros_like(hidden);
    auto grad_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t begin = 0; begin < total; begin += rows) {
      auto n = std::min(rows, total - begin);
      auto g = grad.narrow(0, begin, n);
      auto logits = chunk_logits(hidden, weight, begin, n, inv_temp);
      auto d = logits.sub_(lse.narrow(0, begin, n).unsqueeze(1)).exp_().mul_(g.neg().unsqueeze(1));  // -g * softmax
      d.scatter_add_(1, targets.narrow(0, begin, n).unsqueeze(1), g.unsqueeze(1));                   // + g at target
      d.mul_(inv_temp);
      auto grad_rows = grad_hidden.narrow(0, begin, n);
      at::mm_out(grad_rows, d.to(hidden.scalar_type()), weight);
      grad_weight.addmm_(d.t(), hidden.narrow(0, begin, n).to(at::kFloat));  // in place: no [V, H] temporary
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                  double temperature, int64_t max_chunk_elements, at::ScalarType compute) {
  if (compute != at::kFloat && compute != at::kBFloat16)
    throw std::invalid_argument("chunked_token_logprobs: compute in float32 or bfloat16");
  return chunked_logprob_function::apply(hidden, weight, targets.to(at::kLong), 1.0 / temperature, max_chunk_elements,
                                         compute == at::kBFloat16);
}

at::Tensor naive_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                double temperature) {
  auto logits = at::matmul(hidden, weight.t());
  if (logits.scalar_type() != at::kDouble)  // float64 stays float64: the tests' exact reference
    logits = logits.to(at::kFloat);
  auto logp = at::log_softmax(logits / temperature, -1);
  return logp.gather(1, targets.to(at::kLong).unsqueeze(1)).squeeze(1);
}

}  // namespace areal::kernels
