// The cores of one node, shared by the actors that compute on them (rollout
// workers, the trainer, the evaluator). Work-conserving: an actor busy alone
// uses every thread; actors busy together split them. The trainer, on CPU the
// bottleneck, always runs its micro-batches on every core (data-parallel
// replicas, one thread each) and so overlaps a rollout worker by a thread:
// measured on 2 cores, 826 trained tokens/s against 641 when it took its
// split share only, and against 636 when generation paused for training (its
// in-flight groups went stale and were dropped). The alternative, a static
// split, gives each actor a fixed share always. In-process only: one per node.
#pragma once

#include <algorithm>
#include <atomic>

namespace areal {

class compute_share {
 public:
  /// `threads`: the node's compute threads. `shared` false: a static split,
  /// each of `actors` actors always gets threads / actors (at least 1).
  compute_share(int threads, bool shared, int actors)
      : threads_(std::max(1, threads)), shared_(shared), actors_(std::max(1, actors)) {}

  /// Threads for the trainer: all of them when shared.
  int training_threads() const { return shared_ ? threads_ : threads_now(); }
  /// Intra-op threads for an actor that is busy now.
  int threads_now() const {
    int busy = shared_ ? std::max(1, busy_.load()) : actors_;
    return std::max(1, threads_ / busy);
  }
  void set_busy(bool& holder, bool busy) {
    if (holder == busy)
      return;
    holder = busy;
    busy_ += busy ? 1 : -1;
  }
  int threads() const { return threads_; }
  bool shared() const { return shared_; }

 private:
  int threads_;
  bool shared_;
  int actors_;
  std::atomic<int> busy_{0};
};

}  // namespace areal
