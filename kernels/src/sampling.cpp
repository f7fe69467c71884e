// sample_rows (sampling.hpp): cpu::sample_row's rule as whole-batch ATen
// operations. Rows may differ in their parameters; every row is computed by
// every branch and the branches are selected per row at the end, so the step
// has no host round trip before its single copy of the result. On a GPU a
// batch with no top-k or top-p cut is sampled by one fused kernel instead.
#include "areal/kernels/sampling.hpp"

#include "cuda_decode.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)
#include <stdexcept>
#include <string>

namespace areal::kernels {

namespace {

// The per-row parameters as one host tensor (one transfer to the device).
enum column : int64_t { inv_temperature, greedy, top_k, top_p, uniform, columns };

// The rule as whole-batch ATen operations on the logits' device -> [rows, 3]
// on the host: token, log-probability, 1 where the row is finite.
at::Tensor sample_with_aten(const at::Tensor& logits, const at::Tensor& param, bool any_cut) {
  auto vocab = logits.size(1);
  auto device = logits.device();
  auto col = [&](column c) { return param.select(1, c); };
  auto x = logits.to(at::kFloat);
  auto finite = at::isfinite(x).all(1);
  auto scaled = x * col(inv_temperature).to(at::kFloat).unsqueeze(1);
  auto top = std::get<0>(scaled.max(1, /*keepdim=*/true));
  auto weights = at::exp(scaled - top);                         // [rows, vocab], the largest is 1
  auto total = weights.sum(1, /*keepdim=*/false, at::kDouble);  // [rows]
  auto last = vocab - 1;

  // Greedy: the first largest logit.
  auto token = x.argmax(1);
  // No cut: walk the ids in order.
  auto running = weights.to(at::kDouble).cumsum(1);
  auto target = (col(uniform) * total).unsqueeze(1);
  auto plain = at::searchsorted(running, target, /*out_int32=*/false, /*right=*/true).squeeze(1).clamp_max(last);
  auto drawn = plain;
  if (any_cut) {
    // Candidates most probable first; a stable sort keeps ties in id order.
    auto sorted = weights.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
    auto values = std::get<0>(sorted).to(at::kDouble);
    auto& ids = std::get<1>(sorted);
    auto rank = at::arange(vocab, at::TensorOptions().dtype(at::kDouble).device(device)).unsqueeze(0);
    auto in_k = rank.lt(col(top_k).unsqueeze(1));
    // Top-p renormalizes within the top k (or the whole distribution without k).
    auto reference = at::where(col(top_k).lt(static_cast<double>(vocab)), (values * in_k).sum(1), total);
    auto before = values.cumsum(1) - values;
    auto keep = in_k.logical_and(before.div(reference.unsqueeze(1)).lt(col(top_p).unsqueeze(1)));
    auto kept = (values * keep).cumsum(1);
    auto mass = kept.select(1, last);
    auto kept_count = keep.sum(1);
    auto at_rank = at::searchsorted(kept, (col(uniform) * mass).unsqueeze(1), false, true).squeeze(1);
    at_rank = at::minimum(at_rank, kept_count - 1);
    auto cut = ids.gather(1, at_rank.unsqueeze(1)).squeeze(1);
    auto row_cuts = col(top_k).lt(static_cast<double>(vocab)).logical_or(col(top_p).le(1.0));
    drawn = at::where(row_cuts, cut, plain);
  }
  token = at::where(col(greedy).gt(0.5), token, drawn);
  auto logprob =
      scaled.gather(1, token.unsqueeze(1)).squeeze(1).to(at::kDouble) - top.squeeze(1).to(at::kDouble) - total.log();
  return at::stack({token.to(at::kDouble), logprob, finite.to(at::kDouble)}, 1).to(at::kCPU);
}

}  // namespace

double draw_uniform(at::Generator& generator) {
  auto* g = at::check_generator<at::CPUGeneratorImpl>(generator);
  std::lock_guard<std::mutex> lock(g->mutex_);
  return static_cast<double>(g->random64() >> 11) * 0x1.0p-53;
}

std::vector<sampled_token> sample_rows(const at::Tensor& logits, const std::vector<const sampling_params*>& params,
                                       const std::vector<double>& uniforms) {
  if (logits.dim() != 2 || logits.size(0) != static_cast<int64_t>(params.size()) || uniforms.size() != params.size())
    throw std::invalid_argument("sample_rows: logits [rows, vocab] with one parameter set and one uniform per row");
  auto rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0)
    return {};
  at::NoGradGuard no_grad;
  auto host = at::empty({rows, columns}, at::TensorOptions().dtype(at::kDouble));
  auto* h = host.data_ptr<double>();
  bool any_cut = false;
  for (int64_t i = 0; i < rows; ++i) {
    auto& p = *params[static_cast<size_t>(i)];
    bool is_greedy = p.greedy || p.temperature <= 0;
    bool cut_k = p.top_k > 0 && p.top_k < vocab, cut_p = p.top_p < 1.0f;
    any_cut = any_cut || (!is_greedy && (cut_k || cut_p));
    auto* r = h + i * columns;
    r[inv_temperature] = p.temperature > 0 ? 1.0 / static_cast<double>(p.temperature) : 1.0;
    r[greedy] = is_greedy ? 1 : 0;
    r[top_k] = static_cast<double>(cut_k ? static_cast<int64_t>(p.top_k) : vocab);
    r[top_p] = cut_p ? static_cast<double>(p.top_p) : 2.0;  // 2: no candidate's mass before it reaches it
    r[uniform] = is_greedy ? 0.0 : uniforms[static_cast<size_t>(i)];
  }
  auto param = host.to(logits.device());
  // On a GPU with no row cut, one kernel (cuda_decode.hpp) instead of the
  // dozen passes over [rows, vocab] of sample_with_aten.
  auto result = !any_cut && cuda_decode::sampler_applies(logits)
                    ? cuda_decode::sample_plain(logits, param, inv_temperature, greedy, uniform).to(at::kCPU)
                    : sample_with_aten(logits, param, any_cut);

  std::vector<sampled_token> out(static_cast<size_t>(rows));
  auto* r = result.data_ptr<double>();
  for (int64_t i = 0; i < rows; ++i) {
    if (r[i * 3 + 2] == 0)
      throw std::runtime_error("sampling: row " + std::to_string(i) +
                               " holds a NaN or infinite logit; the model produced NaN or infinite values (diverged "
                               "weights?)");
    out[static_cast<size_t>(i)] = {static_cast<int64_t>(r[i * 3]), static_cast<float>(r[i * 3 + 1])};
  }
  return out;
}

}  // namespace areal::kernels
