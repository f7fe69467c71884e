// balanced_for (cpu_balanced.hpp): the decode step's loops over ATen's intra-op
// threads, where a thread done with its share takes items from another's.

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>

#include "areal/kernels/compute_threads.hpp"
#include "cpu_balanced.hpp"
#include "torch_doctest.hpp"

using areal::kernels::cpu::balanced_for;

TEST_CASE("balanced_for runs every item once: on several threads in ranges of at most a grain, on one in one range") {
  for (int threads : {1, 2, 3, 4})
    for (int64_t n : {0, 1, 2, 5, 31, 64, 1000})
      for (int64_t grain : {1, 3, 8}) {
        INFO("threads " << threads << ", items " << n << ", grain " << grain);
        areal::kernels::set_compute_threads(threads);
        std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
        std::atomic<int> bad_ranges{0};
        balanced_for(n, grain, [&](int64_t begin, int64_t end, int64_t share_end) {
          auto longest = threads == 1 ? n : grain;
          if (begin < 0 || end > n || begin >= end || end - begin > longest || share_end < end)
            ++bad_ranges;
          for (auto i = begin; i < end; ++i)
            ++runs[static_cast<size_t>(i)];
        });
        CHECK(bad_ranges == 0);
        int wrong = 0;
        for (auto& r : runs)
          wrong += r != 1;
        CHECK(wrong == 0);
      }
  areal::kernels::set_compute_threads(2);
}

TEST_CASE("a thread held up in its share leaves the rest of that share to another thread") {
  // The range run first (whichever thread runs it) waits, at most 10 s, until another thread has run an item of
  // the same share (items [0, 32) or [32, 64)): split evenly, nobody else would, and the wait would end only at
  // its limit.
  areal::kernels::set_compute_threads(2);
  constexpr int64_t n = 64;
  auto share_of = [](int64_t i) { return i < n / 2 ? 0 : 1; };
  std::mutex mutex;
  std::vector<std::thread::id> ran_by(n);
  std::atomic<int> ranges{0};
  std::atomic<bool> helped{false};
  std::thread::id held;
  int64_t held_share = -1;
  balanced_for(n, 1, [&](int64_t begin, int64_t end, int64_t) {
    bool first = ranges++ == 0;
    auto me = std::this_thread::get_id();
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto i = begin; i < end; ++i)
        ran_by[static_cast<size_t>(i)] = me;
      if (first) {
        held = me;
        held_share = share_of(begin);
      } else if (held_share == share_of(begin) && me != held) {
        helped = true;
      }
    }
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (first && !helped && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  CHECK(helped);
  int by_others = 0;
  for (int64_t i = 0; i < n; ++i)
    by_others += share_of(i) == held_share && ran_by[static_cast<size_t>(i)] != held;
  CHECK(by_others > 0);

  SUBCASE("switched off, the items are split evenly and each thread runs its own half") {
    areal::kernels::set_balanced_loops(false);
    std::vector<std::thread::id> owner(n);
    balanced_for(n, 1, [&](int64_t begin, int64_t end, int64_t) {
      for (auto i = begin; i < end; ++i)
        owner[static_cast<size_t>(i)] = std::this_thread::get_id();
    });
    areal::kernels::set_balanced_loops(true);
    for (int64_t i = 1; i < n / 2; ++i)
      CHECK(owner[static_cast<size_t>(i)] == owner[0]);
  }
}
