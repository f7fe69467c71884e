// The trainer actor: wraps kernels::trainer in a detached actor (own thread).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "areal/actors/compute_share.hpp"
#include "areal/actors/interfaces.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/trace.hpp"

namespace areal {

struct trainer_setup {
  std::shared_ptr<kernels::policy_model> model;  // owned by the trainer from now on
  kernels::trainer_config config;
  kernels::advantage_estimator estimator = kernels::advantage_estimator::grpo;
  kernels::reward_shaping shaping;
  int compute_threads = 1;  // kernels::set_compute_threads on the trainer's thread, unless `share` is set
  int64_t initial_version = 0;
  std::string resume_from;               // a checkpoint directory to load first (empty: none)
  /// Written into every checkpoint's model/ beside the weights, so that it is a
  /// model directory a later run (model.path) or Hugging Face tools load (empty: none).
  std::string tokenizer_json;
  std::shared_ptr<compute_share> share;  // optional: the node's cores, shared with the rollout workers
  std::shared_ptr<tracer> trace;         // optional: spans "train", "checkpoint", "weight sync"
  /// The KL anchor pi_ref (used when config.kl_coef > 0): the policy RL started
  /// from, never updated. Its log-probabilities of every batch are one more forward pass.
  std::shared_ptr<kernels::policy_model> reference;
  /// Where each new version goes: the publisher (local workers by pointer,
  /// remote nodes in bulk), or without one straight to `rollouts`.
  weight_publisher_actor publisher;
  /// Where the versions handed to the publisher lie: its setup's `device` (the model's GPU where
  /// NCCL links send them, else host memory).
  std::string publish_device = "cpu";
  std::vector<rollout_actor> rollouts;
  std::chrono::milliseconds publish_timeout{600000};
  evaluator_actor evaluator;  // optional: answers eval_atom
};

trainer_actor spawn_trainer(caf::actor_system& sys, trainer_setup setup);

}  // namespace areal
