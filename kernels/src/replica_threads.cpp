#include "areal/kernels/replica_threads.hpp"

#include <algorithm>

namespace areal::kernels {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

replica_threads::~replica_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (auto& t : threads_)
    t.join();
}

void replica_threads::run(size_t parts, const std::function<void(size_t)>& part) {
  if (parts == 0)
    return;
  std::unique_lock<std::mutex> lock(mutex_);
  while (threads_.size() + 1 < parts) {
    auto k = threads_.size() + 1;
    threads_.emplace_back([this, k] { serve(k); });
  }
  part_ = &part;
  parts_ = parts;
  running_ = parts - 1;
  errors_.assign(parts, nullptr);
  part_seconds_.assign(parts, 0.0);
  ++pass_;
  lock.unlock();
  auto start = std::chrono::steady_clock::now();
  work_.notify_all();
  try {
    part(0);
  } catch (...) {
    errors_[0] = std::current_exception();
  }
  part_seconds_[0] = seconds_since(start);
  lock.lock();
  done_.wait(lock, [&] { return running_ == 0; });
  auto pass_s = seconds_since(start);
  if (parts > 1)  // one part waits for nobody
    for (auto s : part_seconds_)
      waited_s_ += std::max(0.0, pass_s - s);
  part_ = nullptr;
  for (auto& e : errors_)
    if (e)
      std::rethrow_exception(e);
}

void replica_threads::serve(size_t k) {
  size_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || pass_ != seen; });
    if (stopping_)
      return;
    seen = pass_;
    if (k >= parts_)
      continue;  // this pass has fewer parts than threads
    auto part = part_;
    lock.unlock();
    auto start = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      (*part)(k);
    } catch (...) {
      error = std::current_exception();
    }
    auto seconds = seconds_since(start);
    lock.lock();
    part_seconds_[k] = seconds;
    errors_[k] = error;
    if (--running_ == 0)
      done_.notify_one();
  }
}

}  // namespace areal::kernels
