// The cores of one node, shared by the actors that compute on them (rollout
// workers, the trainer, the evaluator). Work-conserving: an actor busy alone
// uses every thread; actors busy together split them. The trainer, on CPU the
// bottleneck, always runs its micro-batches on every core (data-parallel
// replicas, one thread each) and so overlaps a rollout worker by a thread:
// measured on 2 cores, 826 trained tokens/s against 641 when it took its
// split share only, and against 636 when generation paused for training (its
// in-flight groups went stale and were dropped). The alternative, a static
// split, gives each actor a fixed share always. In-process only: one per node.
//
// When the actors take turns (the synchronous mode: generate, then train),
// one that stops ends its thread's OpenMP workers, so that the next phase's
// pool is the only one and its workers spin at full length between parallel
// regions: libgomp cuts every waiting worker's spin to 100 iterations once the
// pools' workers outnumber the CPUs, idle pools included (compute_threads.hpp).
// The demo's RL phase in synchronous mode, from its warm-started model, run
// alternately with and without: 37-40 s with the idle pools kept, 34-36 s
// without. When the actors overlap (the asynchronous mode: three compute
// threads on two cores while the trainer runs) the pools stay: the short spin
// is what such oversubscribed teams need (released there too, the demo's RL
// phase took 32-41 s instead of 31-37 s, more of its CPU time spinning).
#pragma once

#include <algorithm>
#include <atomic>

#include "areal/kernels/compute_threads.hpp"

namespace areal {

class compute_share {
 public:
  /// `threads`: the node's compute threads. `shared` false: a static split,
  /// each of `actors` actors always gets threads / actors (at least 1).
  /// `taking_turns`: the actors never compute at once (the synchronous mode).
  compute_share(int threads, bool shared, int actors, bool taking_turns = false)
      : threads_(std::max(1, threads)), shared_(shared), actors_(std::max(1, actors)), taking_turns_(taking_turns) {}

  /// Threads for the trainer: all of them when shared.
  int training_threads() const { return shared_ ? threads_ : threads_now(); }
  /// Intra-op threads for an actor that is busy now.
  int threads_now() const {
    int busy = shared_ ? std::max(1, busy_.load()) : actors_;
    return std::max(1, threads_ / busy);
  }
  /// Called on the actor's compute thread as it starts and stops computing.
  void set_busy(bool& holder, bool busy) {
    if (holder == busy)
      return;
    holder = busy;
    busy_ += busy ? 1 : -1;
    if (!busy && taking_turns_)
      kernels::release_compute_threads();
  }
  int threads() const { return threads_; }
  bool shared() const { return shared_; }

 private:
  int threads_;
  bool shared_;
  int actors_;
  bool taking_turns_;
  std::atomic<int> busy_{0};
};

}  // namespace areal
