// The threads the trainer's data-parallel replicas run on, kept for the
// trainer's life: a pass hands each one its part and waits, instead of creating
// and joining threads for every forward or backward pass.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace areal::kernels {

class replica_threads {
 public:
  replica_threads() = default;
  ~replica_threads();
  replica_threads(const replica_threads&) = delete;
  replica_threads& operator=(const replica_threads&) = delete;

  /// Runs part(k) for k = 0 .. parts-1: part 0 on the calling thread, the
  /// others on threads of their own (started when first needed, then kept).
  /// Returns when every part has finished; rethrows the first part's exception.
  void run(size_t parts, const std::function<void(size_t)>& part);

  /// Threads started so far (not counting the caller's).
  size_t size() const { return threads_.size(); }

  /// Seconds the parts of every pass so far spent waiting for the pass's last
  /// part (the sum over parts of the pass's time minus the part's own): what
  /// the replicas' lockstep costs, e.g. when one shares its core with another
  /// thread and the others wait for it. The caller takes differences.
  double waited_seconds() const { return waited_s_; }

 private:
  void serve(size_t k);

  std::vector<std::thread> threads_;  // threads_[i] runs part i + 1
  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable done_;
  const std::function<void(size_t)>* part_ = nullptr;
  size_t parts_ = 0;
  size_t pass_ = 0;     // counts passes; a thread runs each pass once
  size_t running_ = 0;  // parts of this pass not finished yet, on the threads
  std::vector<std::exception_ptr> errors_;
  std::vector<double> part_seconds_;  // this pass's parts, each written by its own thread
  double waited_s_ = 0;
  bool stopping_ = false;
};

}  // namespace areal::kernels
