// The decoupled PPO objective (AReaL): three policies per token —
// behaviour (recorded at sampling, possibly several versions), proximal (the
// trainer's parameters before this step, one forward pass) and current:
//
//   r_t = pi_theta / pi_prox,   w_t = pi_prox / pi_behav   (w is a constant)
//   loss_t = -w_t * min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps_high) * A_t)
//
// Tokens with w_t above the cap are masked (or w clamped); an optional dual clip
// bounds the loss for negative advantages. With decoupled = false it is standard
// PPO anchored at the behaviour policy; when prox = behav both are the same.
#pragma once

#include <string>

#include <ATen/ATen.h>

namespace areal::kernels {

struct ppo_config {
  double clip_low = 0.2;   // eps
  double clip_high = 0.2;  // eps_high
  double behaviour_cap = 5.0;
  bool cap_clamps = false;  // false: tokens with w above the cap are masked; true: w is clamped to the cap
  double dual_clip = 0.0;   // c > 1 enables the dual clip; 0: off
  bool decoupled = true;    // false: standard PPO with pi_behav as the anchor
};

struct ppo_token_stats {
  int64_t tokens = 0;
  int64_t clipped = 0;           // ratio outside the clip range where it mattered
  int64_t behaviour_masked = 0;  // w above the cap (masked or clamped)
  double importance_weight_sum = 0;
};

/// Per-token losses [N] (masked tokens contribute 0). logp [N] requires grad;
/// logp_prox, logp_behav, advantages [N] are constants. The caller divides the
/// sum by the PPO minibatch's token count (token mean over the minibatch).
/// `loss_mask` [N] (optional, 0 or 1): tokens with 0 (a multi-turn episode's
/// tool and template tokens) get loss 0 and are not counted in `stats`.
at::Tensor ppo_token_losses(const at::Tensor& logp, const at::Tensor& logp_prox, const at::Tensor& logp_behav,
                            const at::Tensor& advantages, const ppo_config& config, ppo_token_stats* stats = nullptr,
                            const at::Tensor& loss_mask = {});

enum class kl_estimator { k1, k2, k3 };
kl_estimator parse_kl_estimator(const std::string& name);

/// Per-token estimate of KL(pi_theta || pi_ref) from log-probabilities of the sampled tokens.
at::Tensor kl_penalty(const at::Tensor& logp, const at::Tensor& logp_ref, kl_estimator estimator);

}  // namespace areal::kernels
