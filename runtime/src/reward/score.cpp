// Scoring a response for its task: the verifier the task names, and its reward (see score.hpp).
#include "areal/reward/score.hpp"

namespace areal::reward {

verification score_response(std::string_view response, const reward_task& task, const scoring_options& options,
                            const std::atomic<bool>* cancel) {
  switch (task.kind) {
    case task_kind::math: {
      auto math = options.math;
      math.last_number_is_answer = task.last_number_answer;
      return verify_math(response, task.references, math);
    }
    case task_kind::countdown: {
      std::vector<long long> numbers(task.numbers.begin(), task.numbers.end());
      return verify_countdown(response, numbers, task.target, options.countdown);
    }
    case task_kind::code: {
      code_task code;
      for (auto& c : task.io_cases)
        code.io_cases.push_back({c.input, c.expected_output});
      code.assertions = task.assertions;
      code.test_setup = task.test_setup;
      code.entry_points = task.entry_points;
      code.case_time_s = task.case_time_s;
      code.total_time_s = task.total_time_s;
      code.partial_credit = task.partial_credit;
      return verify_code(response, code, options.code, cancel);
    }
  }
  return {verdict::error, 0.0f, "unknown task kind"};
}

}  // namespace areal::reward
