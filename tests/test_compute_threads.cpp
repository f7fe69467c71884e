// The trainer's persistent replica threads and the per-thread intra-op count.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include <ATen/Parallel.h>

#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/replica_threads.hpp"

using areal::kernels::replica_threads;

TEST_CASE("replica threads run every part once per pass, on threads kept across passes") {
  replica_threads pool;
  std::mutex m;
  std::set<std::thread::id> first_ids, later_ids;
  for (int pass = 0; pass < 50; ++pass) {
    std::vector<int> runs(3, 0);
    pool.run(3, [&](size_t k) {
      std::lock_guard<std::mutex> lock(m);
      ++runs[k];
      (pass == 0 ? first_ids : later_ids).insert(std::this_thread::get_id());
    });
    CHECK(runs == std::vector<int>{1, 1, 1});
  }
  CHECK(pool.size() == 2);
  CHECK(first_ids.size() == 3);
  CHECK(later_ids == first_ids);  // no thread started after the first pass
  CHECK(first_ids.count(std::this_thread::get_id()) == 1);  // part 0 ran here
  // A pass with fewer parts leaves the other threads idle.
  std::atomic<int> count{0};
  pool.run(2, [&](size_t) { ++count; });
  CHECK(count == 2);
  CHECK(pool.size() == 2);
}

TEST_CASE("an exception in a replica's part reaches the caller after every part has finished") {
  replica_threads pool;
  std::atomic<int> finished{0};
  CHECK_THROWS_WITH(pool.run(3,
                             [&](size_t k) {
                               if (k == 2)
                                 throw std::runtime_error("replica 2 failed");
                               ++finished;
                             }),
                    "replica 2 failed");
  CHECK(finished == 2);
  // The pool works on after a failure.
  pool.run(3, [&](size_t) { ++finished; });
  CHECK(finished == 5);
}

TEST_CASE("set_compute_threads sets the calling thread's count only") {
  areal::kernels::set_compute_threads(2);
  std::thread([] {
    areal::kernels::set_compute_threads(1);
    CHECK(at::get_num_threads() == 1);
  }).join();
  CHECK(at::get_num_threads() == 2);
  areal::kernels::set_compute_threads(0);  // at least one
  CHECK(at::get_num_threads() == 1);
}
