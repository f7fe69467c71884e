// Evaluations outside the controller's steps (see job_parts.hpp): the
// held-out accuracy of the final weights, and its line in metrics.jsonl.
#include <fstream>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "areal/actors/evaluator.hpp"
#include "areal/actors/trainer_actor.hpp"
#include "areal/runtime/files.hpp"
#include "areal/runtime/log.hpp"
#include "job_parts.hpp"

namespace areal::job {

namespace fs = std::filesystem;

std::optional<double> recorded_accuracy_before(const fs::path& run_dir, int64_t prompts) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == "eval" && j.value("before", false) && j.contains("accuracy") &&
        j["accuracy"].is_number())
      return j.value("prompts", prompts) == prompts ? std::optional{j["accuracy"].get<double>()} : std::nullopt;
  }
  return std::nullopt;
}

void eval_line(const fs::path& run_dir, const char* which, double time_s, int64_t version, double accuracy,
               double mean_tokens, int64_t prompts) {
  auto line = nlohmann::json{{"event", "eval"},
                             {"time_s", time_s},
                             {"version", version},
                             {"accuracy", accuracy},
                             {"response_tokens_mean", mean_tokens},
                             {which, true}};
  if (prompts >= 0)
    line["prompts"] = prompts;  // what a resumed run's gain is counted against
  try {
    append_only_file metrics(run_dir / "metrics.jsonl");
    metrics.append(line.dump() + "\n");
    metrics.sync();
  } catch (const file_error& e) {
    spdlog::error("the final evaluation is not in the metrics: {}", e.what());
  }
}

void evaluate_final(caf::scoped_actor& self, const trainer_side& side, bool remote, const model_parts& m,
                    const eval_set& evals, const eval_options& eo, const fs::path& run_dir, double time_s,
                    rl_job_result& result) {
  if (remote) {
    self->request(side.trainer, std::chrono::seconds(600), eval_atom::value)
        .receive(
            [&](int64_t version, double accuracy, double mean_tokens) {
              result.accuracy_after = accuracy;
              spdlog::info("held-out greedy accuracy after RL (version {}): {:.1f}%", version, 100 * accuracy);
              eval_line(run_dir, "final", time_s, version, accuracy, mean_tokens);
            },
            [&](caf::error& e) { spdlog::warn("the final evaluation failed: {}", describe(e)); });
    return;
  }
  self->request(side.trainer, std::chrono::seconds(60), weights_atom::value)
      .receive(
          [&](local_weights& w) {
            kernels::policy_model final_model(m.config, m.policy->options());
            final_model.flat().copy_(*w.flat);
            auto r = evaluate_policy(final_model, *m.tokenizer, evals, eo);
            if (r.stopped) {
              spdlog::info("the final evaluation was stopped by the signal");
              return;
            }
            result.accuracy_after = r.accuracy;
            spdlog::info("held-out greedy accuracy after RL (version {}): {:.1f}% ({})", w.version, 100 * r.accuracy,
                         by_difficulty_text(r));
            eval_line(run_dir, "final", time_s, w.version, r.accuracy, r.mean_tokens);
          },
          [&](caf::error& e) { spdlog::warn("cannot fetch the final weights: {}", describe(e)); });
}

}  // namespace areal::job
