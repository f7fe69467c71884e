// The controller: streams prompts, expands each into a group of n samples,
// admits them under the staleness bound, dispatches them to rollout workers by
// free capacity, routes finished trajectories through the reward pool into the
// group buffer, hands the trainer a batch as soon as one is complete, and sends
// every new version's weights to the rollout workers.
#pragma once

#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "areal/tasks/tasks.hpp"

namespace areal {

struct controller_setup {
  std::unique_ptr<tasks::task_source> source;
  std::shared_ptr<const kernels::tokenizer> tokenizer;
  int64_t group_size = 4;       // samples per prompt
  int64_t batch_size = 16;      // trajectories per training step (whole groups)
  int64_t eta = 1;              // staleness bound in versions; 0 is synchronous
  int64_t max_concurrent = 64;  // requests in flight over all rollout workers
  int64_t rollout_slots = 32;   // requests in flight per rollout worker
  int64_t total_steps = 10;     // training steps of the run
  sampling_params sampling;
  uint64_t seed = 1;
  std::vector<rollout_actor> rollouts;
  reward_pool_actor reward;
  trainer_actor trainer;
  /// Receives (done_atom, int32_t exit_code, std::string why) once, when the run ends.
  caf::actor listener;
};

controller_actor spawn_controller(caf::actor_system& sys, controller_setup setup);

}  // namespace areal
