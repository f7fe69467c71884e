// One entry point for every task kind: what the reward workers call.
#pragma once

#include <atomic>
#include <string_view>

#include "areal/messages/records.hpp"
#include "areal/reward/code_verifier.hpp"
#include "areal/reward/verifiers.hpp"

namespace areal::reward {

struct scoring_options {
  math_options math;
  countdown_options countdown;
  code_options code;
};

/// Scores `response` against `task` with the verifier of the task's kind.
/// `cancel` (optional) stops a long code verification early with a timeout verdict.
verification score_response(std::string_view response, const reward_task& task, const scoring_options& options = {},
                            const std::atomic<bool>* cancel = nullptr);

}  // namespace areal::reward
