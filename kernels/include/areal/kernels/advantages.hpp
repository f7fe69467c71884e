// Critic-free advantages over groups (the n samples of one prompt), reward
// shaping, and the KL estimators against a reference policy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace areal::kernels {

enum class advantage_estimator {
  grpo,     // (r - mean) / (std + eps), std over the group (unbiased)
  dr_grpo,  // r - mean
  rloo,     // r - mean of the others
};
advantage_estimator parse_estimator(const std::string& name);

struct reward_shaping {
  double bias = 0.0;  // r' = clip((r + bias) * scale)
  double scale = 1.0;
  double clip = 0.0;  // |r'| <= clip; 0: no clip
  // Overlong penalty: responses longer than max_length - buffer lose up to
  // `factor` linearly, reaching it at max_length. 0 buffer: off.
  int64_t overlong_max_length = 0;
  int64_t overlong_buffer = 0;
  double overlong_factor = 1.0;
};

/// The shaped reward of one response of `length` tokens.
double shape_reward(double reward, int64_t length, const reward_shaping& shaping);

/// Advantages of one group's rewards. A group whose rewards are all equal gets
/// zeros (never NaN); a group of one gets zero.
std::vector<double> group_advantages(const std::vector<double>& rewards, advantage_estimator estimator,
                                     double eps = 1e-6);

}  // namespace areal::kernels
