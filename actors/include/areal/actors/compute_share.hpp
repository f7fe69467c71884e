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
// OpenMP teams. A rollout worker alone runs its decode steps on every thread:
// a team whose waiting workers spin between the step's parallel regions. The
// spin is long only while the process's pools hold no more workers than there
// are CPUs (libgomp cuts it to 100 iterations otherwise, idle pools included;
// compute_threads.hpp), so an actor that stops computing ends its thread's
// workers. A long spin must never share its cores: an actor that starts
// computing waits for a team step in progress to end (a few milliseconds)
// before it computes beside it, and the evaluator (long) computes on one
// thread. Measured on the demo (2 cores, run alternately): the synchronous RL
// phase 37-40 s with the idle pools kept, 34-36 s with them ended; the
// asynchronous phase, whose engine rarely computes alone, the same within
// the machine's noise (paired runs 30/29, 32/35, 39/41 s). Ending the pools
// without the wait, and with the evaluator on a team of two, made it slower
// (32-41 s against 31-37 s: the engine's and the evaluator's teams spun while
// the trainer's replicas held their workers' cores).
//
// Between steps. In an asynchronous run the trainer's next batch is usually
// buffered when a step ends and reaches it a millisecond or two later; had it
// counted as idle, a rollout worker would start a step on every thread, and
// the trainer's next step would wait for that step to end: 0.48 s of the
// demo's 14 s RL phase (median 0.02 ms, 90th percentile 9.6 ms a step).
// Between steps it counts as busy for the share's linger more.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "areal/kernels/compute_threads.hpp"

namespace areal {

class compute_share {
 public:
  /// `threads`: the node's compute threads. `shared` false: a static split,
  /// each of `actors` actors always gets threads / actors (at least 1).
  /// `linger`: how long an actor between steps still counts as busy (set_between_steps).
  compute_share(int threads, bool shared, int actors, std::chrono::milliseconds linger = {})
      : threads_(std::max(1, threads)), shared_(shared), actors_(std::max(1, actors)), linger_(linger) {}
  compute_share(const compute_share&) = delete;
  compute_share& operator=(const compute_share&) = delete;

  /// Threads for the trainer: all of them when shared.
  int training_threads() const { return shared_ ? threads_ : threads_now(); }
  /// Intra-op threads for an actor that is busy now.
  int threads_now() const {
    int busy = shared_ ? std::max(1, busy_.load() + (lingering() ? 1 : 0)) : actors_;
    return std::max(1, threads_ / busy);
  }

  /// Called on the actor's compute thread as it starts and stops computing.
  /// Starting waits for a team step in progress (begin_step) to end; stopping
  /// ends the thread's OpenMP workers.
  void set_busy(bool& holder, bool busy) {
    if (holder == busy)
      return;
    holder = busy;
    if (busy) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (&holder == lingerer_)
        linger_until_ns_ = 0;  // counted as busy again
      ++busy_;
      team_ended_.wait(lock, [this] { return teams_ == 0; });
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
    kernels::release_compute_threads();
  }

  /// set_busy(holder, false) for an actor that expects its next step soon (one
  /// actor of a share: the trainer): for the linger the others still count it.
  void set_between_steps(bool& holder) {
    if (!holder)
      return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lingerer_ = &holder;
      linger_until_ns_ = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(linger_).count();
    }
    set_busy(holder, false);
  }

  /// For an actor that computes in short steps (a rollout worker's engine
  /// steps), around each: the threads for the step; on more than one, the
  /// step is a team that an actor starting to compute waits for.
  int begin_step() {
    std::lock_guard<std::mutex> lock(mutex_);
    int threads = threads_now();
    if (threads > 1)
      ++teams_;
    return threads;
  }
  void end_step(int threads) {
    if (threads <= 1)
      return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --teams_;
    }
    team_ended_.notify_all();
  }

  /// One short step of an actor (begin_step and end_step around it); without
  /// a share, `threads` of its own.
  class step {
   public:
    step(compute_share* share, int threads) : share_(share), threads_(share ? share->begin_step() : threads) {}
    ~step() {
      if (share_)
        share_->end_step(threads_);
    }
    step(const step&) = delete;
    step& operator=(const step&) = delete;
    int threads() const { return threads_; }

   private:
    compute_share* share_;
    int threads_;
  };

  int threads() const { return threads_; }
  bool shared() const { return shared_; }

 private:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  bool lingering() const { return linger_until_ns_.load() > now_ns(); }

  int threads_;
  bool shared_;
  int actors_;
  std::chrono::milliseconds linger_;
  std::atomic<int64_t> linger_until_ns_{0};
  const bool* lingerer_ = nullptr;  // whose linger it is
  std::atomic<int> busy_{0};
  std::mutex mutex_;
  std::condition_variable team_ended_;
  int teams_ = 0;  // steps on more than one thread in progress
};

}  // namespace areal
