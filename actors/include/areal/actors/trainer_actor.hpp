// The trainer actor: wraps kernels::trainer in a detached actor (own thread).
#pragma once

#include <memory>

#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"
#include "areal/kernels/trainer.hpp"

namespace areal {

struct trainer_setup {
  std::shared_ptr<kernels::policy_model> model;  // owned by the trainer from now on
  kernels::trainer_config config;
  kernels::advantage_estimator estimator = kernels::advantage_estimator::grpo;
  kernels::reward_shaping shaping;
  int compute_threads = 1;
  int64_t initial_version = 0;
};

trainer_actor spawn_trainer(caf::actor_system& sys, trainer_setup setup);

}  // namespace areal
