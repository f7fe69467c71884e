// Held-out evaluation: greedy decoding of every held-out prompt, scored by the
// reward verifiers. `evaluate_policy` is the plain function (the run calls it
// before and after RL); the evaluator actor runs it on its own thread during a
// run, on weights the controller sends it.
#pragma once

#include <atomic>

#include <map>
#include <memory>
#include <vector>

#include <caf/actor_system.hpp>

#include "areal/actors/compute_share.hpp"
#include "areal/actors/interfaces.hpp"
#include "areal/kernels/model.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "areal/reward/score.hpp"
#include "areal/runtime/trace.hpp"

namespace areal {

struct eval_set {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<reward_task> tasks;
  std::vector<int64_t> difficulty;  // optional: a per-prompt bucket (running sums: number of terms)
};

struct eval_result {
  double accuracy = 0;                                           // fraction judged correct
  double mean_tokens = 0;                                        // mean response length
  std::map<int64_t, std::pair<int64_t, int64_t>> by_difficulty;  // bucket -> (correct, total)
  bool stopped = false;                                          // `stop` was set: the figures are not complete
};

struct eval_options {
  int64_t max_new_tokens = 96;
  std::vector<int32_t> stop_tokens;
  int64_t slots = 64;
  int64_t max_seq_len = 256;
  reward::scoring_options scoring;
  const std::atomic<bool>* stop = nullptr;  // when set (a signal), decoding ends at the next step
};

eval_result evaluate_policy(kernels::policy_model& model, const kernels::tokenizer& tokenizer, const eval_set& set,
                            const eval_options& options);

struct evaluator_setup {
  kernels::model_config model;
  at::TensorOptions model_options = at::TensorOptions().dtype(at::kFloat);  // its model copy: the trainer's device
  std::shared_ptr<const kernels::tokenizer> tokenizer;
  std::shared_ptr<const eval_set> set;
  eval_options options;
  std::shared_ptr<compute_share> share;  // optional; else compute_threads
  int compute_threads = 1;
  std::shared_ptr<tracer> trace;
};

evaluator_actor spawn_evaluator(caf::actor_system& sys, evaluator_setup setup);

}  // namespace areal
