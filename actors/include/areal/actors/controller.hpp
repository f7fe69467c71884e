// The controller: a thin actor over the run's bookkeeping parts. It takes
// samples from the prompt stream under the staleness gate and dispatches each
// to the least loaded rollout worker with the least loaded reward pool; the
// trajectory travels worker -> pool -> sample store, and the controller gets
// its summary (ids, verdict, lengths) into the group buffer. As soon as a batch
// is complete it names its slots to the store, which hands them to the
// trainer; the trainer publishes the new weights. The sample ledger records
// where every sample is; the member tables hold the rollout workers and reward
// pools with their requests; run_metrics writes metrics.jsonl; run_checkpoint
// holds what a resumed run continues from.
//
// Accounting: every admitted sample ends trained, or dropped with a reason.
// At a checkpoint the groups started but not yet trained are recorded by their
// position in the prompt stream; a resumed run generates them again first
// (with the newest weights), then continues the stream where it stopped: no
// prompt is trained twice or skipped.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"
#include "areal/actors/prompt_stream.hpp"
#include "areal/actors/run_checkpoint.hpp"
#include "areal/runtime/trace.hpp"
#include "areal/tasks/tasks.hpp"

namespace areal {

struct controller_setup {
  std::unique_ptr<tasks::task_source> source;
  prompt_stream::encoder encode;  // prompt text -> token ids
  int64_t group_size = 4;         // samples per prompt
  int64_t batch_size = 16;        // trajectories per training step (whole groups)
  int64_t eta = 1;                // staleness bound in versions; 0 is synchronous
  int64_t max_concurrent = 64;    // requests in flight over all rollout workers
  int64_t rollout_slots = 32;     // requests in flight per rollout worker
  int64_t total_steps = 10;       // training steps of the run
  sampling_params sampling;
  uint64_t seed = 1;
  std::vector<rollout_actor> rollouts;  // in this process; more may join (join_atom)
  reward_pool_actor reward;             // in this process (optional when reward pools join)
  trainer_actor trainer;                // checkpoints and evaluations
  sample_store_actor store;             // beside the trainer: scored trajectories, batches
  /// Whether the trainer's node publishes weights to other nodes (the metrics
  /// then report transfer times).
  bool remote_weights = false;
  /// Deadline of every sample's request (generation, scoring, storing); a
  /// sample whose request fails is generated again (up to 3 attempts), not lost.
  std::chrono::milliseconds request_timeout{600000};
  /// Deadline of each request to the trainer (a step, a checkpoint, an
  /// evaluation): a trainer that hangs ends the run with the reason instead
  /// of holding it forever.
  std::chrono::milliseconds trainer_timeout{3600000};
  /// A trainer on a node of its own may be lost and join again (the job asks
  /// for it): the controller watches it, pauses while it is gone (not ending
  /// the run), and waits this long after it joined again for every rollout
  /// worker to take the weights it started from. Zero: losing it ends the run.
  std::chrono::milliseconds trainer_rejoin{0};
  /// How long the run may have no rollout worker (before the first joins, or
  /// after the last is lost) before it stops with a checkpoint.
  std::chrono::milliseconds member_timeout{120000};
  int64_t eval_every = 0;        // steps between evaluations by the trainer's evaluator (0: none)
  std::string metrics_path;      // JSON lines appended here; empty: no metrics file
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 0;  // steps; 0: only when the run ends or stops
  std::optional<controller_checkpoint> resume;
  std::shared_ptr<tracer> trace;
  /// Agent runs: samples are episodes opened by endpoints (episode_atom), not
  /// the prompt stream's; no reward pool is needed (the agent gives the reward).
  bool agent_episodes = false;
  /// A group whose group_size episodes did not all open within this is dropped.
  std::chrono::milliseconds episode_timeout{600000};
  /// Receives (done_atom, int32_t exit_code, std::string why) once, when the run ends.
  done_listener_actor listener;
};

controller_actor spawn_controller(caf::actor_system& sys, controller_setup setup);

}  // namespace areal
