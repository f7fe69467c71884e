// The sample ledger: the one record of where every sample of the run is. CAF
// free, so that it is tested exactly. Every sample has an id (its group and its
// index in the group); the ledger records its admission, each dispatch to a
// rollout worker, each retry, its scoring, its batch, its training or its drop
// with a reason, and answers "where is sample X" and "what is unaccounted".
//
// Transitions are checked: a sample is admitted once, trained at most once, and
// nothing happens to it after it was trained or dropped. A transition the
// ledger refuses is a bug in its caller: it throws std::logic_error, naming the
// sample and both stages.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace areal {

/// A sample of the run: the index-th of the group_size samples of one prompt.
struct sample_id {
  uint64_t group = 0;
  uint32_t index = 0;
  bool operator<(const sample_id& o) const { return group != o.group ? group < o.group : index < o.index; }
  bool operator==(const sample_id& o) const { return group == o.group && index == o.index; }
};

std::string to_string(const sample_id& id);

/// Where a sample is. The first four stages are "in flight"; the last three are final.
enum class sample_stage : uint8_t {
  queued,      // admitted, waiting for a rollout worker (again, after a failed attempt)
  generating,  // a rollout worker has it
  scoring,     // generated; with a reward pool or waiting for one
  buffered,    // scored; in the group buffer, waiting for its group and a batch
  training,    // in the batch the trainer works on
  trained,     // final: trained in a step
  dropped,     // final: dropped, with a reason
};

const char* to_string(sample_stage x);

/// What the ledger knows of one sample.
struct sample_entry {
  sample_id id;
  sample_stage stage = sample_stage::queued;
  uint64_t prompt_position = 0;  // the prompt's position in the prompt stream
  int64_t admitted_version = 0;  // policy version when it was admitted
  uint32_t attempts = 0;         // generation requests sent for it
  uint32_t retries = 0;          // generation requests that failed for it
  std::string holder;            // the member that has it now (generating, scoring), else empty
  int64_t step = 0;              // the training step (training, trained)
  std::string reason;            // why it was dropped, or why the last attempt failed
};

class sample_ledger {
 public:
  /// A new sample enters the run (passed the staleness gate).
  void admit(sample_id id, uint64_t prompt_position, int64_t version);
  /// Sent to a rollout worker.
  void dispatched(sample_id id, const std::string& worker);
  /// Its generation failed (lost worker, deadline, aborted): queued again.
  void retry(sample_id id, const std::string& why);
  /// Generated; sent (or waiting) to be scored, by `pool` when it is known.
  void generated(sample_id id, const std::string& pool = {});
  /// Its scoring request went to `pool` (again, after a full queue or a lost pool).
  void scoring_at(sample_id id, const std::string& pool);
  /// Scored and in the group buffer.
  void scored(sample_id id);
  /// In the batch of training step `step`.
  void batched(sample_id id, int64_t step);
  /// Its training step is done.
  void trained(sample_id id);
  /// Dropped with `reason`; nothing happens to it after.
  void dropped(sample_id id, const std::string& reason);
  /// Every sample of `group` not final yet is dropped with `reason`.
  void drop_group(uint64_t group, const std::string& reason);

  /// The sample's entry, or nothing when it was never admitted.
  std::optional<sample_entry> where(sample_id id) const;
  /// Every admitted sample that is neither trained nor dropped, in id order.
  std::vector<sample_entry> unaccounted() const;
  /// Every entry, in id order.
  std::vector<sample_entry> entries() const;

  int64_t admitted() const { return admitted_; }
  int64_t trained_count() const { return trained_; }
  int64_t dropped_count() const { return dropped_; }
  int64_t in_flight() const { return admitted_ - trained_ - dropped_; }
  /// Drops of this run, by reason.
  const std::map<std::string, int64_t>& drop_reasons() const { return drop_reasons_; }

 private:
  sample_entry& at(sample_id id, std::initializer_list<sample_stage> allowed, const char* what);

  std::map<sample_id, sample_entry> entries_;
  std::map<std::string, int64_t> drop_reasons_;
  int64_t admitted_ = 0, trained_ = 0, dropped_ = 0;
};

}  // namespace areal
