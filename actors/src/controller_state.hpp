// The controller's state and the functions its two source files share:
// controller.cpp moves samples (admission, dispatch with a reward pool, retries,
// members joining and lost), controller_steps.cpp runs the course of the run
// (training steps, weights, evaluations, checkpoints, the end). Internal.
#pragma once

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "areal/actors/admission.hpp"
#include "areal/actors/controller.hpp"
#include "areal/actors/member_table.hpp"
#include "areal/actors/run_metrics.hpp"
#include "areal/actors/sample_ledger.hpp"

namespace areal::controller_detail {

// A sample with a rollout worker (and, once generated, with the reward pool
// chosen for it): its stream entry, and its request at that pool's table.
struct in_flight_sample {
  stream_sample sample;
  uint64_t pool_request = 0;
  std::string pool;  // its name
};

// The actor holding one rollout worker's requests for the controller (see
// spawn_link in controller.cpp): (request id, the request) in, and
// (reply_atom, request id, summary or error) back to the controller.
using member_link_actor =
    caf::typed_actor<caf::reacts_to<uint64_t, packed<generation_request>, packed<reward_task>, caf::actor, caf::actor>>;

// The run's course: admitting work, then draining (no more admissions; what
// runs is trained), saving the final checkpoint, finished.
enum class run_phase { admitting, draining, saving, finished };

struct controller_state {
  static inline const char* name = "areal.controller";
  controller_setup setup;
  std::unique_ptr<prompt_stream> stream;
  std::unique_ptr<staleness_gate> gate;
  std::unique_ptr<group_buffer> buffer;
  std::unique_ptr<run_metrics> metrics;
  sample_ledger ledger;
  member_table<caf::actor, in_flight_sample> rollouts;
  member_table<caf::actor, uint64_t> rewards;
  std::map<caf::actor_addr, member_link_actor> links;  // per rollout worker: the actor holding its requests
  run_phase phase = run_phase::admitting;
  // checkpointing: from a checkpoint's start until the trainer holds its copy
  // (no step meanwhile); writing_checkpoint: from then until it is on disk (steps go on).
  bool training = false, checkpointing = false, writing_checkpoint = false, evaluating = false;
  // A checkpoint due while the last one is still being written: it starts once that one is on disk.
  std::function<void()> after_write;
  bool member_deadline_armed = false;
  // Since when a role has been missing without a break (the member deadline counts from it).
  std::optional<caf::actor_clock::time_point> members_missing_since;
  // Rollout requests in flight by deadline (send order: one timeout for all), and whether the timer runs.
  std::deque<std::pair<caf::actor_clock::time_point, uint64_t>> deadlines;
  bool request_deadline_armed = false;
  int32_t end_code = 0;
  std::string end_why;          // set when an end was asked for (a stop, no rollout worker, the last step)
  int64_t failures_in_row = 0;  // samples dropped since the last one that was scored
  controller_stats stats;
  controller_checkpoint before;  // the counters of the runs before a resume
  int64_t generated_tokens = 0, trained_tokens = 0;
  std::vector<sample_id> in_training;  // the batch of the step in flight
  // Agent runs: the group taking episodes now, by task key; the episodes an endpoint holds.
  struct agent_group {
    uint64_t id = 0;
    uint32_t opened = 0;
  };
  std::map<std::string, agent_group> open_groups;
  std::set<sample_id> episodes_running;
  uint64_t next_group = 0;
  // The trainer on a node of its own (setup.trainer_rejoin): lost, and back
  // from its last checkpoint while the rollout workers take that checkpoint's weights.
  bool trainer_missing = false;
  bool awaiting_weights = false;
  caf::actor_clock::time_point awaiting_since;
  uint64_t trainer_epoch = 0;       // replies from a trainer of an earlier epoch are let go
  uint64_t next_rid = 0;            // the id the next rollout request gets (ids only grow)
  uint64_t first_rid_of_epoch = 0;  // replies to older requests name slots of a lost store
};

using controller_pointer = controller_actor::stateful_pointer<controller_state>;

/// Everything goes back to a checkpoint's record: counters, staleness gate,
/// prompt stream (with the saved work), metrics; buffer and ledger start empty.
void go_back_to(controller_pointer self, const controller_checkpoint& r);
/// Admits what the run's remaining steps train and, when eta allows it, one
/// batch more (staleness_gate::limit_total): the spare batch lets the last
/// steps take the samples that finish first, as every step before them does,
/// instead of waiting for the slowest (or a hung one until its deadline); more
/// would only be generated to be thrown away.
inline void limit_admission(controller_state& st) {
  auto remaining = std::max<int64_t>(0, st.setup.total_steps - st.stats.steps);
  auto spare = std::min<int64_t>(st.setup.eta, 1);
  st.gate->limit_total(st.gate->accepted() + (remaining + spare) * st.setup.batch_size);
}
/// The trainer was lost; a trainer joined again from the checkpoint `record` (controller_trainer.cpp).
void trainer_lost(controller_pointer self, const std::string& why);
void trainer_back(controller_pointer self, const caf::actor& trainer, const caf::actor& store,
                  const std::string& record);
/// The poll of the rollout workers' weights after a trainer joined again (sent to itself).
void poll_rollout_weights(controller_pointer self, uint64_t epoch);
/// Whether the run may admit work and train: a trainer is there and the rollout workers have its weights.
inline bool trainer_ready(const controller_state& st) {
  return !st.trainer_missing && !st.awaiting_weights;
}
/// The counters of the stats reply, from the ledger (and the runs before a resume).
void refresh_counts(controller_state& st);
/// Closes the groups the buffer dropped (ledger, gate, stream, their trajectories in the store).
void settle_drops(controller_pointer self);
/// Admits and dispatches samples while capacity allows.
void fill(controller_pointer self);
/// Hands the trainer a batch when one is complete and no step is in flight.
void try_train(controller_pointer self);
/// Ends the run once no step or checkpoint is in flight: final checkpoint, then done.
void end_run(controller_pointer self, int32_t code, const std::string& why);
/// Ends the run now: every unfinished sample dropped with the reason, the end line, the listener told.
void finish(controller_pointer self, int32_t code, const std::string& why);
/// The trainer's report of how a version's weights reached each subscriber.
void weights_delivered(controller_pointer self, const std::vector<weight_delivery>& reports);
/// A sample will not be trained: dropped with the reason (its group with it).
void drop(controller_pointer self, sample_id id, const std::string& reason);
/// Requests past their deadline are generated again; the timer is armed for the next.
void request_deadlines(controller_pointer self);
/// The reply to rollout request `rid`: a summary, or the error it failed with.
void on_reply(controller_pointer self, uint64_t rid, sample_summary& summary);
void on_failure(controller_pointer self, uint64_t rid, const caf::error& err);
/// A summary arrived: the trajectory is scored and in the store.
void on_summary(controller_pointer self, sample_id id, const std::string& pool, sample_summary& summary);
/// A stored trajectory that will not be trained: the store lets it go.
void forget(controller_pointer self, const sample_summary& summary);
/// Agent runs (controller_episodes.cpp): an endpoint opens an episode of a task.
caf::result<uint64_t, uint32_t, int64_t> open_episode(controller_pointer self, const std::string& task,
                                                      const std::string& holder);
/// An episode ended (its summary), or was dropped by its endpoint (a reason).
void episode_ended(controller_pointer self, sample_summary& summary);
void episode_dropped(controller_pointer self, sample_id id, const std::string& reason);
/// A group's deadline passed.
void group_deadline(controller_pointer self, uint64_t group);
/// The ledger as JSON (the ledger_atom reply).
std::string ledger_json(const sample_ledger& ledger);

}  // namespace areal::controller_detail
