// The trainer's persistent replica threads, the per-thread intra-op count (also as a training pass leaves it) and
// the OpenMP workers ended between turns.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include <ATen/Parallel.h>

#include "areal/actors/compute_share.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/replica_threads.hpp"
#include "areal/kernels/trainer.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

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
  CHECK(later_ids == first_ids);                            // no thread started after the first pass
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

TEST_CASE("replica threads count the time parts wait for a pass's last part") {
  replica_threads pool;
  CHECK(pool.waited_seconds() == 0.0);
  // Part 0 ends at once; part 1 sleeps at least 50 ms: part 0 waits at least that long for it.
  pool.run(2, [](size_t k) {
    if (k == 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  auto after_one = pool.waited_seconds();
  CHECK(after_one >= 0.05);
  // A pass with one part has nobody to wait for.
  pool.run(1, [](size_t) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  CHECK(pool.waited_seconds() == after_one);
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

namespace {

// Threads of this process now.
size_t process_threads() {
  size_t n = 0;
  for ([[maybe_unused]] auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

// Waits (up to 2 s) until the process has `expected` threads; returns the count it saw last.
size_t settle_at(size_t expected) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  auto n = process_threads();
  while (n != expected && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n = process_threads();
  }
  return n;
}

// A parallel region of two parts: with two intra-op threads, one runs on a worker of this thread's pool.
void two_parts() {
  std::atomic<int> parts{0};
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) { parts += static_cast<int>(end - begin); });
  REQUIRE(parts == 2);
}

}  // namespace

// libgomp shortens every waiting worker's spin once the workers of all pools
// outnumber the CPUs, so an idle compute thread must not keep its pool.
TEST_CASE("release_compute_threads ends the calling thread's OpenMP workers, and the next region starts them again") {
  auto before = process_threads();
  std::thread([before] {
    areal::kernels::set_compute_threads(2);
    two_parts();
    CHECK(settle_at(before + 2) == before + 2);  // this thread and its pool's worker
    areal::kernels::release_compute_threads();
    CHECK(settle_at(before + 1) == before + 1);
    two_parts();  // the next region starts a worker again
    CHECK(settle_at(before + 2) == before + 2);
    areal::kernels::release_compute_threads();
    CHECK(settle_at(before + 1) == before + 1);
    areal::kernels::set_compute_threads(1);
    two_parts();  // one thread: no worker
    CHECK(settle_at(before + 1) == before + 1);
    areal::kernels::release_compute_threads();  // nothing to end
    CHECK(at::get_num_threads() == 1);
  }).join();
  CHECK(settle_at(before) == before);
}

TEST_CASE("an actor that stops computing ends its thread's OpenMP workers") {
  auto before = process_threads();
  std::thread([before] {
    areal::compute_share share(2, true, 2);
    bool busy = false;
    share.set_busy(busy, true);
    areal::kernels::set_compute_threads(share.threads_now());
    two_parts();
    CHECK(settle_at(before + 2) == before + 2);
    share.set_busy(busy, false);
    CHECK(settle_at(before + 1) == before + 1);
  }).join();
  CHECK(settle_at(before) == before);
}

TEST_CASE("an actor that starts computing waits for a team step in progress, and steps beside it get one thread") {
  areal::compute_share share(2, true, 2);
  bool engine_busy = false, trainer_busy = false;
  share.set_busy(engine_busy, true);
  int threads = share.begin_step();  // the engine alone: a team of two
  CHECK(threads == 2);
  std::atomic<bool> started{false};
  std::thread trainer([&] {
    share.set_busy(trainer_busy, true);
    started = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_FALSE(started.load());      // still inside the team step
  CHECK(share.threads_now() == 1);  // counted as busy already: the next step is not a team
  share.end_step(threads);
  trainer.join();
  CHECK(started.load());
  bool other_busy = false;
  {
    areal::compute_share::step step{&share, 2};  // beside the trainer: one thread, not a team
    CHECK(step.threads() == 1);
    share.set_busy(other_busy, true);  // does not wait for a one-thread step
  }
  share.set_busy(other_busy, false);
  CHECK(areal::compute_share::step{nullptr, 3}.threads() == 3);  // no share: the actor's own
  share.set_busy(trainer_busy, false);
  share.set_busy(engine_busy, false);
  CHECK(share.threads_now() == 2);
}

TEST_CASE("a training pass on several replicas gives the calling thread its intra-op thread count back") {
  auto config = areal::test::small_model_config(24);
  areal::kernels::policy_model model(config);
  model.init_random(3, 0.05);
  areal::kernels::trainer_config tc;
  tc.data_parallel = 2;
  tc.max_tokens_per_mb = 16;  // several micro-batches: two replicas run
  areal::kernels::trainer t(model, tc);
  std::vector<areal::kernels::rl_sample> batch;
  for (int i = 0; i < 4; ++i) {
    areal::kernels::rl_sample s;
    s.prompt = {1, static_cast<int32_t>(2 + i)};
    s.response = {3, 4, 5, 6, 7, 8};
    s.behaviour_logprobs.assign(s.response.size(), -3.0f);
    s.advantage = i % 2 ? 1.0 : -1.0;
    batch.push_back(s);
  }
  areal::kernels::set_compute_threads(2);
  auto stats = t.ppo_gradients(batch);
  CHECK(stats.micro_batches > 1);
  CHECK(at::get_num_threads() == 2);
  areal::kernels::set_compute_threads(1);
}

namespace {

// The engine and the trainer busy together; then the trainer's step ends.
void step_beside_engine(areal::compute_share& share, bool& engine_busy, bool& trainer_busy) {
  share.set_busy(engine_busy, true);
  share.set_busy(trainer_busy, true);
  share.set_between_steps(trainer_busy);
}

}  // namespace

TEST_CASE("the trainer between steps still counts as busy for the share's linger") {
  using std::chrono::milliseconds;
  auto never = milliseconds(600'000);  // a linger that does not pass during the test
  SUBCASE("a step of the engine then is no team, and the trainer's next step starts beside it") {
    areal::compute_share share(2, true, 2, never);
    bool engine_busy = false, trainer_busy = false;
    step_beside_engine(share, engine_busy, trainer_busy);
    CHECK_FALSE(trainer_busy);
    int threads = share.begin_step();
    CHECK(threads == 1);
    auto next_step = std::async(std::launch::async, [&] { share.set_busy(trainer_busy, true); });
    CHECK(next_step.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    share.end_step(threads);
    next_step.get();
    // Busy again, its linger is over: once it stops for good the engine gets every thread.
    share.set_busy(trainer_busy, false);
    CHECK(share.threads_now() == 2);
    share.set_busy(engine_busy, false);
  }
  SUBCASE("another actor that starts computing does not end the trainer's linger") {
    areal::compute_share share(4, true, 2, never);
    bool engine_busy = false, trainer_busy = false;
    step_beside_engine(share, engine_busy, trainer_busy);
    share.set_busy(engine_busy, false);
    share.set_busy(engine_busy, true);
    CHECK(share.threads_now() == 2);  // the engine's half, not every thread
    share.set_busy(engine_busy, false);
  }
  SUBCASE("no linger (a synchronous run): stopping between steps is stopping") {
    areal::compute_share share(4, true, 2);
    bool engine_busy = false, trainer_busy = false;
    step_beside_engine(share, engine_busy, trainer_busy);
    CHECK(share.threads_now() == 4);
    share.set_busy(engine_busy, false);
  }
}
