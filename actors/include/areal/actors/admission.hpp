// The controller's bookkeeping, free of CAF so that it is tested exactly:
// the staleness gate (which generation requests may start) and the group
// buffer (which scored trajectories form the next training batch).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "areal/actors/sample_summary.hpp"

namespace areal {

/// Admission under the staleness bound eta (ARCHITECTURE.md section 2). With B
/// the batch size in trajectories, v the policy version the rollout workers
/// generate with (the trainer's, or when weights travel to other nodes the last
/// one delivered: see `follow_deliveries`), `accepted` the trajectories
/// delivered to the buffer and `running` those in flight, a request may start
/// while
///     min(max_concurrent - running, (eta + v + 1) * B - (accepted + running),
///         limit - (accepted + running)) > 0,
/// with `limit` what the run will still train (limit_total).
/// Equivalently the i-th trajectory ever admitted satisfies floor((i-1)/B) <= v + eta.
/// eta = 0 is synchronous: a batch's samples all come from the newest weights.
class staleness_gate {
 public:
  staleness_gate(int64_t batch_size, int64_t eta, int64_t max_concurrent);

  /// How many more requests may start now (0 or more); for work sent to the
  /// rollout node `node`, counting from what that node holds (delivered_to).
  int64_t capacity() const { return capacity(std::string{}); }
  int64_t capacity(const std::string& node) const;
  /// Records `n` admitted requests (sent to `node`); throws std::logic_error past its capacity.
  void admit(int64_t n = 1, const std::string& node = {});
  /// A running request ended: delivered to the buffer (counts as accepted) or dropped.
  void finish(bool delivered);
  /// `n` delivered trajectories will never be trained (dropped as too stale):
  /// they no longer count as accepted, so that admission can replace them.
  void discard(int64_t n);
  /// The policy version advanced (after a training step).
  void set_version(int64_t version);
  /// From now on admission counts from the version whose weights reached the
  /// rollout workers (`delivered`), not from the trainer's: a request started
  /// while the new weights are still on their way generates with the old ones,
  /// and is trained eta versions after the new one (in a four-process run at
  /// eta 2, 27% of the samples admitted so were dropped as staler than the
  /// bound). The reference system gates on the version its servers loaded too.
  void follow_deliveries();
  /// The weights of `version` reached the rollout workers (or their delivery
  /// settled otherwise: a failed transfer does not hold admission forever).
  void delivered(int64_t version);
  /// The rollout node `node` reported that it holds `version`, which can come
  /// long before the version settles for all (a node slow to fetch it, or one
  /// that never reports, holds the settlement until the transfer deadline):
  /// work sent to that node counts from the newer of the two. Unknown nodes,
  /// and the members of this process (""), count from the settled version.
  void delivered_to(const std::string& node, int64_t version);
  /// No more than `trajectories` accepted and running together: a run of a
  /// known length admits what its remaining steps train and a spare batch
  /// (controller_state.hpp), not eta + 1 batches beyond its end (a 30-step run
  /// at eta = 8 generated 536 samples that were never trained, 28% more than
  /// it trained, on the cores training needed).
  void limit_total(int64_t trajectories);
  /// Whether that limit, rather than eta or the concurrency, closes the gate now.
  bool at_total_limit() const { return accepted_ + running_ >= limit_; }
  /// After a resume from a checkpoint of policy version v: nothing runs, and
  /// `accepted` is what v batches consumed (the reference system once forgot this
  /// and let staleness run past eta after a restart).
  void restore(int64_t version);

  int64_t version() const { return version_; }
  /// The version admission counts from: `version()`, or the delivered one when
  /// behind (for `node`: the newer of the settled one and the node's own).
  int64_t admission_version() const { return admission_version(std::string{}); }
  int64_t admission_version(const std::string& node) const;
  int64_t accepted() const { return accepted_; }
  int64_t running() const { return running_; }
  int64_t admitted_total() const { return admitted_total_; }
  int64_t batch_size() const { return batch_size_; }
  int64_t eta() const { return eta_; }

 private:
  int64_t batch_size_, eta_, max_concurrent_;
  int64_t version_ = 0, accepted_ = 0, running_ = 0, admitted_total_ = 0;
  int64_t limit_ = INT64_MAX;
  bool follows_deliveries_ = false;
  int64_t delivered_ = 0;
  std::map<std::string, int64_t> delivered_to_;  // by node: the newest version it reported
};

/// Collects the summaries of scored trajectories by group (the n samples of one
/// prompt); a group enters a batch only when all its samples arrived. Groups
/// with a dropped sample are dropped whole, with the reason kept.
class group_buffer {
 public:
  explicit group_buffer(int64_t group_size);

  void add(sample_summary s);
  /// One sample of `group_id` will never arrive (worker lost, generation failed).
  void drop_sample(uint64_t group_id, const std::string& reason);
  /// Complete groups until `batch_size` trajectories (whole groups only), the
  /// group with the oldest token first (earliest deadline first: the next bound
  /// drops it first; among equals, in the order they completed); nothing when
  /// fewer are ready. Complete groups holding a token older than `min_version`
  /// are dropped first (reason "staler than the bound"): admission bounds
  /// staleness by arrival order, but a group that completes late (a long tail)
  /// can still fall behind.
  /// `stale_dropped`, when given, is increased by the trajectories dropped so.
  std::optional<std::vector<sample_summary>> take_batch(int64_t batch_size, int64_t min_version = INT64_MIN,
                                                        int64_t* stale_dropped = nullptr);

  /// A group that left the buffer without being trained (dropped whole): its id,
  /// how many of its samples had been delivered (they counted as accepted) and
  /// their slots in the sample store.
  struct closed_group {
    uint64_t group_id;
    int64_t delivered;
    std::string reason;
    std::vector<uint64_t> slots;
  };
  /// The groups dropped since the last call.
  std::vector<closed_group> take_dropped_groups();

  int64_t ready_trajectories() const { return ready_; }
  int64_t pending_groups() const { return static_cast<int64_t>(partial_.size()); }
  /// Trajectories dropped with their group, by reason.
  const std::map<std::string, int64_t>& dropped() const { return dropped_; }

 private:
  struct partial_group {
    std::vector<sample_summary> members;
    int64_t missing_dropped = 0;
    std::string drop_reason;
  };
  void settle(uint64_t group_id);

  int64_t group_size_;
  std::map<uint64_t, partial_group> partial_;
  // A complete group and the oldest policy version of its tokens.
  struct complete_group {
    std::vector<sample_summary> members;
    int64_t oldest;
  };
  std::deque<complete_group> complete_;  // by oldest, then by completion
  int64_t ready_ = 0;  // trajectories in complete_
  std::map<std::string, int64_t> dropped_;
  std::vector<closed_group> newly_dropped_;
};

}  // namespace areal
