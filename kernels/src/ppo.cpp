#include "areal/kernels/ppo.hpp"

#include <stdexcept>

namespace areal::kernels {

at::Tensor ppo_token_losses(const at::Tensor& logp, const at::Tensor& logp_prox, const at::Tensor& logp_behav,
                            const at::Tensor& advantages, const ppo_config& c, ppo_token_stats* stats,
                            const at::Tensor& loss_mask) {
  auto anchor = (c.decoupled ? logp_prox : logp_behav).detach().to(at::kFloat);
  auto adv = advantages.detach().to(at::kFloat);
  auto ratio = at::exp(logp.to(at::kFloat) - anchor);
  auto clipped_ratio = at::clamp(ratio, 1.0 - c.clip_low, 1.0 + c.clip_high);
  auto unclipped_term = ratio * adv;
  auto clipped_term = clipped_ratio * adv;
  auto objective = at::minimum(unclipped_term, clipped_term);
  if (c.dual_clip > 1.0)
    objective = at::where(adv.lt(0), at::maximum(objective, adv * c.dual_clip), objective);
  at::Tensor weight = at::ones_like(anchor);
  at::Tensor over_cap = at::zeros_like(anchor, at::kBool);
  if (c.decoupled) {
    weight = at::exp(anchor - logp_behav.detach().to(at::kFloat));
    over_cap = weight.gt(c.behaviour_cap);
    weight = c.cap_clamps ? at::clamp_max(weight, c.behaviour_cap) : weight.masked_fill(over_cap, 0.0);
  }
  bool masked = loss_mask.defined();
  auto keep = masked ? loss_mask.to(at::kBool) : at::Tensor{};
  if (masked) {
    weight = weight.masked_fill(keep.logical_not(), 0.0);
    over_cap = over_cap.logical_and(keep);
  }
  if (stats) {
    stats->tokens += masked ? keep.sum().item<int64_t>() : logp.size(0);
    auto clipped = clipped_term.lt(unclipped_term);
    stats->clipped += (masked ? clipped.logical_and(keep) : clipped).sum().item<int64_t>();
    stats->behaviour_masked += over_cap.sum().item<int64_t>();
    stats->importance_weight_sum += weight.sum().item<double>();
  }
  return -(weight * objective);
}

kl_estimator parse_kl_estimator(const std::string& name) {
  if (name == "k1")
    return kl_estimator::k1;
  if (name == "k2")
    return kl_estimator::k2;
  if (name == "k3")
    return kl_estimator::k3;
  throw std::invalid_argument("unknown KL estimator \"" + name + "\"; use k1, k2 or k3");
}

at::Tensor kl_penalty(const at::Tensor& logp, const at::Tensor& logp_ref, kl_estimator estimator) {
  auto log_ratio = logp_ref.detach().to(at::kFloat) - logp.to(at::kFloat);  // log(pi_ref / pi_theta)
  switch (estimator) {
    case kl_estimator::k1:
      return -log_ratio;
    case kl_estimator::k2:
      return 0.5 * log_ratio * log_ratio;
    case kl_estimator::k3:
      return at::exp(log_ratio) - 1.0 - log_ratio;
  }
  return -log_ratio;
}

}  // namespace areal::kernels
