// The rollout worker: wraps the generation engine (kernels/engine.hpp) in a
// detached actor, i.e. on its own thread, where LibTorch may block.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>

#include "areal/actors/compute_share.hpp"
#include "areal/actors/interfaces.hpp"
#include "areal/kernels/engine.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "areal/runtime/trace.hpp"

namespace areal {

struct rollout_setup {
  std::string name = "rollout";                  // written into each trajectory's producer field
  std::shared_ptr<kernels::policy_model> model;  // owned by the worker from now on
  std::shared_ptr<const kernels::tokenizer> tokenizer;
  kernels::engine_config engine;
  int compute_threads = 1;  // kernels::set_compute_threads on the worker's thread, unless `share` is set
  int64_t initial_version = 0;
  std::shared_ptr<compute_share> share;  // optional: the node's cores, shared with the trainer
  std::shared_ptr<tracer> trace;         // optional: spans "generate" and "weight sync"
  /// A sample's deadline at its reward pool and sample store, and how long a
  /// pool may stay full before the sample is answered with an error.
  std::chrono::milliseconds score_timeout{600000};
};

rollout_actor spawn_rollout(caf::actor_system& sys, rollout_setup setup);

}  // namespace areal
