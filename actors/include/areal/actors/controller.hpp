// The controller: streams prompts, expands each into a group of n samples,
// admits them under the staleness bound, dispatches them to rollout workers by
// free capacity, routes finished trajectories through the reward pool into the
// group buffer, hands the trainer a batch as soon as one is complete, and sends
// every new version's weights to the rollout workers. It writes the run's
// metrics (one JSON line per step and per evaluation) and its checkpoints.
//
// Accounting: every admitted sample ends trained, or dropped with a reason.
// At a checkpoint the groups started but not yet trained are recorded by their
// position in the prompt stream; a resumed run generates them again first
// (with the newest weights), then continues the stream where it stopped: no
// prompt is trained twice or skipped.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <chrono>

#include "areal/actors/interfaces.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "areal/runtime/trace.hpp"
#include "areal/tasks/tasks.hpp"

namespace areal {

/// The controller's part of a run checkpoint (file_name, next to the trainer's state).
struct controller_checkpoint {
  int64_t version = 0;
  int64_t steps = 0;
  int64_t admitted = 0;  // = trained + dropped: unfinished work is re-queued, not counted
  int64_t trained = 0;
  int64_t dropped = 0;
  std::map<std::string, int64_t> drop_reasons;
  int64_t max_staleness = 0;
  double reward_mean_first = 0;
  double reward_mean_last = 0;
  uint64_t source_position = 0;             // prompts taken from the stream
  std::vector<uint64_t> requeue;            // stream positions of groups started but not trained
  std::vector<uint64_t> dropped_positions;  // stream positions of the groups dropped (with a reason)
  uint64_t next_group = 0;
  int64_t generated_tokens = 0;
  int64_t trained_tokens = 0;
  double elapsed_s = 0;  // run time before this checkpoint

  /// Its file in a run checkpoint directory.
  static constexpr const char* file_name = "controller_state.json";

  std::string to_json() const;
  /// Throws std::invalid_argument naming `where` when the text is not a controller checkpoint.
  static controller_checkpoint from_json(const std::string& text, const std::string& where);
  /// Reads file_name in a checkpoint directory; throws std::invalid_argument naming the file.
  static controller_checkpoint load(const std::string& checkpoint_directory);
};

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
  std::vector<rollout_actor> rollouts;  // in this process; more may join (join_atom)
  reward_pool_actor reward;             // in this process (optional when reward pools join)
  trainer_actor trainer;
  /// Optional: new weights go to the publisher, which hands them to every
  /// subscriber (local rollout workers by pointer, remote nodes in bulk);
  /// without one they are sent to `rollouts` directly.
  weight_publisher_actor publisher;
  /// Deadline of every request to a rollout worker or reward pool; a sample
  /// whose request fails is generated again (up to 3 attempts), not lost.
  std::chrono::milliseconds request_timeout{600000};
  /// How long the run may have no rollout worker (before the first joins, or
  /// after the last is lost) before it stops with a checkpoint.
  std::chrono::milliseconds member_timeout{120000};
  evaluator_actor evaluator;  // optional: evaluates every eval_every steps
  int64_t eval_every = 0;
  std::string metrics_path;      // JSON lines appended here; empty: no metrics file
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 0;  // steps; 0: only when the run ends or stops
  std::optional<controller_checkpoint> resume;
  std::shared_ptr<tracer> trace;
  /// Receives (done_atom, int32_t exit_code, std::string why) once, when the run ends.
  caf::actor listener;
};

controller_actor spawn_controller(caf::actor_system& sys, controller_setup setup);

}  // namespace areal
