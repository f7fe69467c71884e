// The reward pool: a dispatcher actor and a fixed number of worker actors,
// each on its own thread (verification blocks: the code verifier waits on the
// sandbox). The dispatcher accepts up to queue_capacity jobs and puts them on a
// board from which each idle worker takes the next itself (no round trip through
// the dispatcher between two jobs); workers send their results back. Each job's
// deadline counts from when a worker starts it: when a worker misses it, the
// dispatcher answers that job with a timeout verdict, cancels the worker and
// puts a fresh one in its place, so one stuck verification never stalls the others.
#pragma once

#include <functional>
#include <string>

#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"
#include "areal/reward/score.hpp"
#include "areal/runtime/config.hpp"
#include "areal/runtime/trace.hpp"

namespace areal {

struct reward_pool_config {
  size_t workers = 2;
  size_t queue_capacity = 64;  // queued + being verified
  double timeout_s = 30.0;     // per verification, from when a worker starts it
  reward::scoring_options scoring;
  /// The verifier; the default is reward::score_response. Tests put in others.
  std::function<reward::verification(const std::string& response, const reward_task& task,
                                     const std::atomic<bool>& cancel)>
      scorer;
  std::shared_ptr<tracer> trace;  // optional: a span "reward" per verification, one track per worker
};

/// The pool configuration of a run's [reward] section.
reward_pool_config make_reward_pool_config(const reward_spec& spec);

reward_pool_actor spawn_reward_pool(caf::actor_system& sys, reward_pool_config config);

}  // namespace areal
