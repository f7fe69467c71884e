#include "cpu_balanced.hpp"
#include "areal/kernels/compute_threads.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <memory>

namespace areal::kernels {

namespace {

std::atomic<bool> balancing{true};

}  // namespace

void set_balanced_loops(bool on) {
  balancing = on;
}

namespace cpu {

namespace {

// A share [front, back) as one word: front in the low 32 bits, back in the high.
struct alignas(64) share {
  std::atomic<uint64_t> range{0};
};

uint64_t pack(uint64_t front, uint64_t back) {
  return front | back << 32;
}
int64_t front_of(uint64_t r) {
  return static_cast<int64_t>(r & 0xffffffffu);
}
int64_t back_of(uint64_t r) {
  return static_cast<int64_t>(r >> 32);
}

}  // namespace

void balanced_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int64_t)>& run) {
  if (n <= 0)
    return;
  grain = std::max<int64_t>(1, grain);
  int64_t units = (n + grain - 1) / grain;
  int64_t threads = std::min<int64_t>(at::get_num_threads(), units);
  if (threads <= 1 || at::in_parallel_region()) {
    run(0, n, n);
    return;
  }
  // Switched off, or longer than a share's 32-bit item counts reach: split evenly.
  if (!balancing.load(std::memory_order_relaxed) || n >= (int64_t{1} << 31)) {
    at::parallel_for(0, n, grain, [&](int64_t b0, int64_t b1) { run(b0, b1, b1); });
    return;
  }
  std::unique_ptr<share[]> shares(new share[static_cast<size_t>(threads)]);
  for (int64_t t = 0; t < threads; ++t) {
    // Shares in whole grains, so that only a share's last range is short.
    auto front = std::min(n, units * t / threads * grain), back = std::min(n, units * (t + 1) / threads * grain);
    shares[t].range.store(pack(static_cast<uint64_t>(front), static_cast<uint64_t>(back)), std::memory_order_relaxed);
  }
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {  // its own share(s), from the front
      auto& range = shares[t].range;
      auto r = range.load(std::memory_order_relaxed);
      while (front_of(r) < back_of(r)) {
        auto end = std::min(front_of(r) + grain, back_of(r));
        if (range.compare_exchange_weak(r, pack(static_cast<uint64_t>(end), static_cast<uint64_t>(back_of(r))),
                                        std::memory_order_relaxed)) {
          run(front_of(r), end, back_of(r));
          r = range.load(std::memory_order_relaxed);
        }
      }
    }
    for (int64_t s = 1; s < threads; ++s) {  // then the others', from the back
      auto& range = shares[(t0 + s) % threads].range;
      auto r = range.load(std::memory_order_relaxed);
      while (front_of(r) < back_of(r)) {
        // A grain from the back, ending where the owner's grains end (its share's front plus whole grains).
        auto back = back_of(r), front = front_of(r);
        auto begin = back - 1 - (back - 1 - front) % grain;
        if (range.compare_exchange_weak(r, pack(static_cast<uint64_t>(front), static_cast<uint64_t>(begin)),
                                        std::memory_order_relaxed)) {
          run(begin, back, back);
          r = range.load(std::memory_order_relaxed);
        }
      }
    }
  });
}

}  // namespace cpu

}  // namespace areal::kernels
