// The prompt stream of a run: takes prompts from the task source (the groups
// a checkpoint re-queued first), expands each into a group of samples with
// their seeds, and remembers each open group's position in the stream until it
// is trained or dropped, so that a checkpoint can re-queue what was started and
// not trained. CAF free, so that it is tested exactly.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "areal/messages/records.hpp"
#include "areal/tasks/tasks.hpp"

namespace areal {

/// The seed of sample `index` of group `group`: distinct for every (group,
/// index) of one run seed (an injective key through a bijective mixer), for any
/// group size below 2^32.
uint64_t sample_seed(uint64_t run_seed, uint64_t group, uint32_t index);

/// One sample of a started group, until it is generated.
struct stream_sample {
  generation_request request;
  std::shared_ptr<const reward_task> task;
  uint64_t prompt_position = 0;
  bool admitted = false;  // generated again after a failure: admitted and counted once already
  uint32_t failures = 0;  // generation requests that failed by its own fault (not a lost node)
  // Scored before a resume (its trajectories as the sample store held them):
  // it goes to the store, not to a rollout worker. (Work saved unscored is in
  // request.so_far.)
  std::vector<trajectory> scored;
};

/// Where the stream stands, for a run checkpoint.
struct stream_position {
  uint64_t source_position = 0;             // prompts taken from the source
  std::vector<uint64_t> requeue;            // positions of groups started and not trained, oldest first
  std::vector<uint64_t> dropped_positions;  // positions of the groups dropped (with a reason)
  uint64_t next_group = 0;
  std::vector<uint64_t> requeue_groups;     // their group ids (empty: restarted under new ids)
  std::vector<saved_sample> saved;          // the work done on their samples (restore only)
};

class prompt_stream {
 public:
  using encoder = std::function<std::vector<int32_t>(const std::string&)>;

  prompt_stream(std::unique_ptr<tasks::task_source> source, encoder encode, int64_t group_size,
                sampling_params sampling, uint64_t seed);

  /// Continues from a checkpoint: the re-queued groups come first (under
  /// their ids, so that their samples keep their seeds), then the source at its
  /// position. Their saved samples continue from their saved work: a scored one
  /// comes with its trajectories, an unscored one with its output so far.
  void restore(const stream_position& p);
  /// The saved work the stream still holds, for the next checkpoint: of the
  /// re-queued groups not started yet, and of samples waiting to go out.
  std::vector<saved_sample> saved_work() const;
  /// Saved samples a restore could not use (their prompt is no longer the one they were generated for).
  size_t saved_unused() const { return saved_unused_; }
  /// Saved samples a restore let go because their index is past the group size (the run that saved
  /// them had larger groups, rl.group_size is smaller now): never trained, not saved again.
  size_t saved_past_group() const { return saved_past_group_; }
  /// The position to save: the groups open now are re-queued by a resumed run.
  stream_position position() const;

  /// The next sample to generate: one generated again first, then the next of
  /// the started groups; starts a new group when none is waiting. Nothing when
  /// the source is exhausted and nothing waits.
  std::optional<stream_sample> next();
  /// Whether the next sample is one generated again (admitted already).
  bool next_is_retry() const { return !pending_.empty() && pending_.front().admitted; }
  /// A sample whose generation failed goes first in line (admitted already).
  void generate_again(stream_sample s);

  /// The group was trained: it is no longer open; its stream position.
  std::optional<uint64_t> close_trained(uint64_t group);
  /// The group was dropped: not re-queued by a checkpoint, its position recorded as dropped.
  void close_dropped(uint64_t group);

  size_t open_groups() const { return open_.size(); }
  size_t waiting() const { return pending_.size(); }

 private:
  bool start_group();

  std::unique_ptr<tasks::task_source> source_;
  encoder encode_;
  int64_t group_size_;
  sampling_params sampling_;
  uint64_t seed_;
  std::deque<stream_sample> pending_;        // samples of started groups not yet generating
  struct requeued {
    uint64_t position;
    uint64_t group;
  };
  std::deque<requeued> requeue_;             // groups to start again first (after a resume)
  std::map<std::pair<uint64_t, uint32_t>, saved_sample> saved_;  // by (group, index), until its group starts
  size_t saved_unused_ = 0;
  size_t saved_past_group_ = 0;
  std::map<uint64_t, uint64_t> open_;        // group id -> stream position, until trained or dropped
  std::vector<uint64_t> dropped_positions_;  // stream positions of the groups dropped
  uint64_t next_group_ = 0;
};

}  // namespace areal
