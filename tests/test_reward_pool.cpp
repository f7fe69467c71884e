// The reward pool actor: verdicts for every task kind, nothing lost, throwing
// and hanging verifiers contained, back-pressure when the queue is full.
#include <doctest/doctest.h>

#include <map>
#include <thread>

#include <caf/all.hpp>

#include "actor_test_system.hpp"
#include "areal/actors/node.hpp"
#include "areal/actors/reward_pool.hpp"
#include "sample_records.hpp"

using namespace areal;
using namespace std::chrono_literals;

namespace {

using fixture = test::actor_test_system;

reward_task math_task(std::string answer) {
  reward_task t;
  t.kind = task_kind::math;
  t.references = {std::move(answer)};
  return t;
}

packed<trajectory> traj(uint64_t prompt_id) {
  auto t = test::sample_trajectory();
  t.prompt_id = prompt_id;
  t.judged = verdict::unscored;
  t.reward = 0;
  return *pack(t);
}

// Sends one request and returns the scored trajectory, or the error text.
std::pair<std::optional<trajectory>, std::string> score(fixture& f, reward_pool_actor pool, uint64_t id,
                                                        const std::string& response, const reward_task& task) {
  std::pair<std::optional<trajectory>, std::string> out;
  (*f.self)
      ->request(pool, 60s, traj(id), response, *pack(task))
      .receive([&](packed<trajectory>& t) { out.first = *unpack(t); },
               [&](caf::error& e) { out.second = describe(e); });
  return out;
}

// Waits (cancellably) for up to `limit`: a verifier that does not finish by itself.
reward::verification hang(const std::atomic<bool>& cancel, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!cancel.load() && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(5ms);
  return {verdict::correct, 1.0f, "should have been cut off"};
}

}  // namespace

TEST_CASE("the pool scores math and countdown and code tasks") {
  fixture f;
  auto pool = spawn_reward_pool(*f.sys, reward_pool_config{});
  auto [math, e1] = score(f, pool, 1, "so \\boxed{12}", math_task("12"));
  REQUIRE_MESSAGE(math, e1);
  CHECK(math->prompt_id == 1);
  CHECK(math->judged == verdict::correct);
  CHECK(math->reward == 1.0f);
  CHECK(math->timestamps.scoring_start_ns > 0);
  CHECK(math->timestamps.scored_ns >= math->timestamps.scoring_start_ns);
  CHECK(math->output_tokens == test::sample_trajectory().output_tokens);  // the rest is untouched

  reward_task countdown;
  countdown.kind = task_kind::countdown;
  countdown.numbers = {3, 5, 7};
  countdown.target = 22;
  auto [cd, e2] = score(f, pool, 2, "<answer>3 * 5 + 7</answer>", countdown);
  REQUIRE_MESSAGE(cd, e2);
  CHECK(cd->judged == verdict::correct);

  reward_task code;
  code.kind = task_kind::code;
  code.io_cases = {{"5\n", "25\n"}};
  auto [program, e3] = score(f, pool, 3, "```python\nn = int(input())\nprint(n * n)\n```", code);
  REQUIRE_MESSAGE(program, e3);
  CHECK_MESSAGE(program->judged == verdict::correct, program->verdict_detail);

  auto [wrong, e4] = score(f, pool, 4, "\\boxed{13}", math_task("12"));
  REQUIRE(wrong);
  CHECK(wrong->judged == verdict::wrong);
  CHECK(wrong->reward == 0.0f);
  caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
}

TEST_CASE("a verifier that throws gives verdict error and the pool goes on") {
  fixture f;
  reward_pool_config config;
  config.scorer = [](const std::string& response, const reward_task& task, const std::atomic<bool>&) {
    if (response == "throw")
      throw std::runtime_error("boom");
    return reward::verify_math(response, task.references);
  };
  auto pool = spawn_reward_pool(*f.sys, config);
  auto [failed, e1] = score(f, pool, 1, "throw", math_task("1"));
  REQUIRE(failed);
  CHECK(failed->judged == verdict::error);
  CHECK(failed->verdict_detail.find("boom") != std::string::npos);
  auto [fine, e2] = score(f, pool, 2, "\\boxed{1}", math_task("1"));
  REQUIRE(fine);
  CHECK(fine->judged == verdict::correct);
  caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
}

TEST_CASE("unreadable requests are refused with an error") {
  fixture f;
  auto pool = spawn_reward_pool(*f.sys, reward_pool_config{});
  (*f.self)
      ->request(pool, 10s, packed<trajectory>{std::vector<char>(24, 'x')}, std::string{"\\boxed{1}"},
                *pack(math_task("1")))
      .receive([](packed<trajectory>&) { FAIL("garbage was scored"); },
               [](caf::error& e) { CHECK(e.category() == caf::atom("wire")); });
  auto [fine, e2] = score(f, pool, 2, "\\boxed{1}", math_task("1"));
  CHECK(fine);
  caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
}

TEST_CASE("the pool keeps its throughput while one worker is stuck on a hanging verification") {
  fixture f;
  reward_pool_config config;
  config.workers = 3;
  config.timeout_s = 3.0;
  config.scorer = [](const std::string& response, const reward_task& task, const std::atomic<bool>& cancel) {
    if (response == "hang")
      return hang(cancel, 60s);
    return reward::verify_math(response, task.references);
  };
  auto pool = spawn_reward_pool(*f.sys, config);
  auto& self = *f.self;
  self->send(pool, traj(0), std::string{"hang"}, *pack(math_task("1")));
  constexpr int quick = 60;
  for (int i = 1; i <= quick; ++i)
    self->send(pool, traj(static_cast<uint64_t>(i)), "\\boxed{" + std::to_string(i) + "}",
               *pack(math_task(std::to_string(i))));
  std::vector<uint64_t> order;
  std::optional<trajectory> stuck;
  for (int i = 0; i <= quick; ++i)
    self->receive(
        [&](packed<trajectory>& t) {
          auto decoded = *unpack(t);
          order.push_back(decoded.prompt_id);
          if (decoded.prompt_id == 0)
            stuck = decoded;
          else
            CHECK(decoded.judged == verdict::correct);
        },
        [&](caf::error& e) { FAIL(describe(e)); }, caf::after(30s) >> [] { FAIL("a reply is missing"); });
  REQUIRE(order.size() == quick + 1);
  CHECK(order.back() == 0);  // every quick job was answered before the stuck one timed out
  REQUIRE(stuck);
  CHECK(stuck->judged == verdict::timeout);
  CHECK(stuck->reward == 0.0f);
  self->request(pool, 10s, stats_atom::value)
      .receive(
          [](reward_pool_stats& s) {
            CHECK(s.scored == quick + 1);
            CHECK(s.timeouts == 1);
            CHECK(s.replaced == 1);
            CHECK(s.workers == 3);
            CHECK(s.busy == 0);
          },
          [](caf::error& e) { FAIL(describe(e)); });
  // The replacement worker takes work.
  auto [after, e] = score(f, pool, 99, "\\boxed{5}", math_task("5"));
  CHECK(after);
  caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
}

TEST_CASE("a job waiting behind a stuck verification gets its own deadline and the replacement worker") {
  fixture f;
  reward_pool_config config;
  config.workers = 1;
  config.timeout_s = 1.0;
  config.scorer = [](const std::string& response, const reward_task& task, const std::atomic<bool>& cancel) {
    if (response == "hang")
      return hang(cancel, 60s);
    if (response == "slow")
      hang(cancel, 600ms);  // most of a deadline, after waiting a whole one
    return reward::verify_math("\\boxed{1}", task.references);
  };
  auto pool = spawn_reward_pool(*f.sys, config);
  auto& self = *f.self;
  self->send(pool, traj(0), std::string{"hang"}, *pack(math_task("1")));
  self->send(pool, traj(1), std::string{"slow"}, *pack(math_task("1")));
  std::map<uint64_t, verdict> verdicts;
  for (int i = 0; i < 2; ++i)
    self->receive([&](packed<trajectory>& t) { verdicts[unpack(t)->prompt_id] = unpack(t)->judged; },
                  [&](caf::error& e) { FAIL(describe(e)); }, caf::after(30s) >> [] { FAIL("a reply is missing"); });
  CHECK(verdicts[0] == verdict::timeout);
  CHECK(verdicts[1] == verdict::correct);
  self->request(pool, 10s, stats_atom::value)
      .receive(
          [](reward_pool_stats& s) {
            CHECK(s.timeouts == 1);
            CHECK(s.replaced == 1);
            CHECK(s.queued == 0);
          },
          [](caf::error& e) { FAIL(describe(e)); });
  caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
}

TEST_CASE("a full queue refuses work and loses nothing") {
  fixture f;
  reward_pool_config config;
  config.workers = 1;
  config.queue_capacity = 2;
  config.scorer = [](const std::string&, const reward_task&, const std::atomic<bool>& cancel) {
    hang(cancel, 200ms);
    return reward::verification{verdict::correct, 1.0f, "slow"};
  };
  auto pool = spawn_reward_pool(*f.sys, config);
  auto& self = *f.self;
  for (int i = 0; i < 5; ++i)
    self->send(pool, traj(static_cast<uint64_t>(i)), std::string{"x"}, *pack(math_task("1")));
  int scored = 0, refused = 0;
  for (int i = 0; i < 5; ++i)
    self->receive([&](packed<trajectory>&) { ++scored; },
                  [&](caf::error& e) {
                    CHECK(e.category() == caf::atom("reward"));
                    CHECK(describe(e).find("reward.queue_capacity") != std::string::npos);
                    ++refused;
                  },
                  caf::after(30s) >> [] { FAIL("a reply is missing"); });
  CHECK(scored == 2);
  CHECK(refused == 3);
  caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
}

TEST_CASE("the [reward] section configures the pool") {
  auto r = parse_config(
      "[reward]\nworkers = 4\nqueue_capacity = 9\ntimeout_s = 2\nmemory_mb = 64\n"
      "countdown_use_all_numbers = true\nmath_unmarked_fallback = true\nmath_chain_answers_interval = true\n"
      "[[nodes]]\nname = \"a\"\nroles = [\"controller\", \"trainer\"]\n",
      "r.toml");
  REQUIRE(r.config);
  auto c = make_reward_pool_config(r.config->reward);
  CHECK(c.workers == 4);
  CHECK(c.queue_capacity == 9);
  CHECK(c.timeout_s == 2.0);
  CHECK(c.scoring.code.limits.memory_bytes == (64u << 20));
  CHECK(c.scoring.countdown.use_all_numbers);
  CHECK(c.scoring.math.unmarked_fallback);
  CHECK(c.scoring.math.chain_answers_interval);
  CHECK(c.scoring.code.python == "/usr/bin/python3");
  auto bad =
      parse_config("[reward]\nworkers = 0\n[[nodes]]\nname = \"a\"\nroles = [\"controller\", \"trainer\"]\n", "r.toml");
  REQUIRE(bad.errors.size() == 1);
  CHECK(bad.errors[0].find("r.toml:2:11: reward.workers: value 0 is out of range") != std::string::npos);
}
