// The rollout worker actor: requests in, trajectories out, generated on the
// worker's own thread with the engine; weights swapped at step boundaries;
// samples sent on to a reward pool and its sample store, through back-pressure.
#include <caf/all.hpp>

#include <set>
#include <thread>

#include "actor_test_system.hpp"
#include "areal/actors/node.hpp"
#include "areal/actors/reward_pool.hpp"
#include "areal/actors/rollout.hpp"
#include "areal/actors/run_kernels.hpp"
#include "areal/actors/sample_store.hpp"
#include "job_parts.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal;
using namespace areal::kernels;
using namespace std::chrono_literals;

namespace {

struct fixture : test::actor_test_system {
  std::shared_ptr<const tokenizer> tok =
      std::make_shared<const tokenizer>(tokenizer::character_level("0123456789+=;", {"<unk>", "<eos>"}));
  model_config config = test::small_model_config(tok->vocab_size());

  std::shared_ptr<policy_model> model(uint64_t seed) {
    auto m = std::make_shared<policy_model>(config);
    m->init_random(seed, 0.3);
    return m;
  }

  rollout_actor spawn(std::shared_ptr<policy_model> m, int64_t slots = 4) {
    rollout_setup setup;
    setup.name = "rollout-test";
    setup.model = std::move(m);
    setup.tokenizer = tok;
    setup.engine = {slots, 96, 32};
    return spawn_rollout(*sys, setup);
  }
};

generation_request request(uint64_t i, uint32_t max_new = 12) {
  generation_request r;
  r.prompt_id = i;
  r.group_id = i / 2;
  r.sample_index = static_cast<uint32_t>(i % 2);
  r.prompt_tokens = {3, static_cast<int32_t>(4 + i % 9), 13};
  r.sampling.max_new_tokens = max_new;
  r.seed = 100 + i;
  r.admitted_version = static_cast<int64_t>(i % 3);
  return r;
}

// What the engine produces for the same request, run directly.
generation_output direct(policy_model& m, const generation_request& r, int64_t version = 0) {
  generation_engine engine(m, {1, 96, 32}, version);
  generation_job job;
  job.prompt = r.prompt_tokens;
  job.sampling = r.sampling;
  job.seed = r.seed;
  engine.submit(job);
  return engine.run_to_completion().front();
}

// A reward pool whose one worker holds each verification until `release` is set (at most 30 s).
reward_pool_actor holding_pool(fixture& f, std::atomic<bool>& release) {
  reward_pool_config pc;
  pc.workers = 1;
  pc.scorer = [&release](const std::string&, const reward_task&, const std::atomic<bool>& cancelled) {
    for (int i = 0; i < 6000 && !release && !cancelled; ++i)
      std::this_thread::sleep_for(5ms);
    return reward::verification{verdict::correct, 1.0f, "fine"};
  };
  return spawn_reward_pool(*f.sys, pc);
}

}  // namespace

TEST_CASE("the rollout worker answers every request with its trajectory and text") {
  fixture f;
  auto reference = f.model(1);
  auto worker = f.spawn(f.model(1));
  auto& self = *f.self;
  for (uint64_t i = 0; i < 10; ++i)
    self->send(worker, *pack(request(i)));
  std::map<uint64_t, trajectory> got;
  for (int i = 0; i < 10; ++i)
    self->receive(
        [&](packed<trajectory>& t, std::string& text) {
          auto decoded = *unpack(t);
          CHECK(text == f.tok->decode(decoded.output_tokens, true));
          got[decoded.prompt_id] = decoded;
        },
        [](caf::error& e) { FAIL(describe(e)); }, caf::after(30s) >> [] { FAIL("a trajectory is missing"); });
  REQUIRE(got.size() == 10);
  for (auto& [id, t] : got) {
    auto r = request(id);
    CHECK(t.prompt_tokens == r.prompt_tokens);
    CHECK(t.group_id == r.group_id);
    CHECK(t.producer == "rollout-test");
    CHECK(t.finish == finish_reason::length);
    CHECK(t.output_tokens.size() == 12);
    CHECK(t.token_versions == std::vector<int64_t>(12, 0));
    CHECK(t.prompt_version == r.admitted_version);  // the prompt tokens carry the version at admission
    CHECK(t.timestamps.generation_end_ns >= t.timestamps.generation_start_ns);
    CHECK(t.output_tokens == direct(*reference, r).tokens);  // same seed, same weights, same tokens
  }
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
}

TEST_CASE("weights sent to the worker are used from the next step on") {
  fixture f;
  auto next = f.model(2);
  auto worker = f.spawn(f.model(1));
  auto& self = *f.self;
  auto weights = std::make_shared<const at::Tensor>(next->flat().clone());
  self->send(worker, local_weights{5, weights});
  auto r = request(3, 10);
  self->request(worker, 30s, *pack(r))
      .receive(
          [&](packed<trajectory>& t, std::string&) {
            auto decoded = *unpack(t);
            CHECK(decoded.token_versions == std::vector<int64_t>(10, 5));
            CHECK(decoded.output_tokens == direct(*next, r, 5).tokens);
          },
          [](caf::error& e) { FAIL(describe(e)); });
  // Mid-stream: weights arrive while five requests are in flight and before a
  // sixth. Whether a given in-flight request finished before the weights came is
  // up to the scheduler (a loaded machine once finished all of them first), so
  // only what the mailbox order guarantees is asserted: versions never go back,
  // nothing is older than 5, and the request sent after the weights is all 6.
  // (The engine's own tests pin down the interruption itself, step by step.)
  auto newest = std::make_shared<const at::Tensor>(f.model(3)->flat().clone());
  for (uint64_t i = 0; i < 5; ++i)
    self->send(worker, *pack(request(i, 40)));
  self->send(worker, local_weights{6, newest});
  self->send(worker, *pack(request(5, 40)));
  int mixed = 0;
  for (int i = 0; i < 6; ++i)
    self->receive(
        [&](packed<trajectory>& t, std::string&) {
          auto decoded = *unpack(t);
          const auto& v = decoded.token_versions;
          CHECK(std::is_sorted(v.begin(), v.end()));
          CHECK(v.front() >= 5);
          CHECK(v.back() <= 6);
          if (decoded.prompt_id == 5)
            CHECK(v == std::vector<int64_t>(40, 6));
          mixed += v.front() == 5 && v.back() == 6;
        },
        [](caf::error& e) { FAIL(describe(e)); }, caf::after(30s) >> [] { FAIL("a trajectory is missing"); });
  MESSAGE(mixed << " of 5 in-flight requests were interrupted mid-stream");
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
}

TEST_CASE("a request the engine cannot take is refused and the worker goes on") {
  fixture f;
  auto worker = f.spawn(f.model(1));
  auto& self = *f.self;
  self->request(worker, 30s, *pack(request(0, 500)))
      .receive([](packed<trajectory>&, std::string&) { FAIL("an impossible request was accepted"); },
               [](caf::error& e) { CHECK(describe(e).find("exceeds the engine's max_seq_len") != std::string::npos); });
  self->request(worker, 30s, packed<generation_request>{std::vector<char>(16, 'x')})
      .receive([](packed<trajectory>&, std::string&) { FAIL("garbage accepted"); },
               [](caf::error& e) { CHECK(e.category() == caf::atom("wire")); });
  self->request(worker, 30s, *pack(request(1)))
      .receive([](packed<trajectory>& t, std::string&) { CHECK(unpack(t)->output_tokens.size() == 12); },
               [](caf::error& e) { FAIL(describe(e)); });
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
}

TEST_CASE("a full reward pool delays samples, and each reaches the sample store once") {
  fixture f;
  auto& self = *f.self;
  auto worker = f.spawn(f.model(1));
  reward_pool_config pc;
  pc.workers = 1;
  pc.queue_capacity = 1;  // one verification at a time: most offers are refused
  pc.scorer = [](const std::string&, const reward_task&, const std::atomic<bool>&) {
    std::this_thread::sleep_for(2ms);
    return reward::verification{verdict::correct, 1.0f, "fine"};
  };
  auto pool = spawn_reward_pool(*f.sys, pc);
  trainer_actor no_trainer;  // nothing is trained here
  auto store = spawn_sample_store(*f.sys, no_trainer);
  const uint64_t n = 12;
  for (uint64_t i = 0; i < n; ++i)
    self->send(worker, *pack(request(i)), *pack(reward_task{}), caf::actor_cast<caf::actor>(pool),
               caf::actor_cast<caf::actor>(store));
  std::set<uint64_t> slots;
  std::set<std::pair<uint64_t, uint32_t>> ids;
  for (uint64_t i = 0; i < n; ++i)
    self->receive(
        [&](sample_summary& s) {
          slots.insert(s.slot);
          ids.emplace(s.group_id, s.sample_index);
          CHECK(s.reward == 1.0f);
          CHECK(s.producer == "rollout-test");
        },
        [&](caf::error& e) { FAIL(describe(e)); }, caf::after(60s) >> [] { FAIL("no summary within 60 s"); });
  CHECK(slots.size() == n);
  CHECK(ids.size() == n);
  self->request(pool, 10s, stats_atom::value)
      .receive(
          [&](reward_pool_stats& s) {
            MESSAGE("offers refused while the pool was full: " << s.refused);
            CHECK(s.refused > 0);  // back-pressure happened, and lost nothing
            CHECK(s.scored == n);  // and scored each sample once
          },
          [](caf::error& e) { FAIL(describe(e)); });
  self->request(store, 10s, stats_atom::value)
      .receive([&](uint64_t held) { CHECK(held == n); }, [](caf::error& e) { FAIL(describe(e)); });
  for (auto a :
       {caf::actor_cast<caf::actor>(worker), caf::actor_cast<caf::actor>(pool), caf::actor_cast<caf::actor>(store)})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_CASE("rl.interruption and rl.prompt_pool_tokens reach the rollout workers' engines") {
  kernels::model_config m;
  m.max_position_embeddings = 512;
  run_config c;
  CHECK(rollout_engine_config(c, m).interruption == interruption_mode::reprefill);  // the default
  for (auto [name, mode] :
       {std::pair{"keep_cache", interruption_mode::keep_cache}, std::pair{"wait", interruption_mode::wait}}) {
    c.rl.interruption = name;
    CHECK(rollout_engine_config(c, m).interruption == mode);
  }
  c.rl.rollout_slots = 7;
  CHECK(rollout_engine_config(c, m).slots == 7);
  CHECK(rollout_engine_config(c, m).max_seq_len == 512);
  CHECK(rollout_engine_config(c, m).prompt_pool_tokens == run_config{}.rl.prompt_pool_tokens);
  c.rl.prompt_pool_tokens = 0;
  CHECK(rollout_engine_config(c, m).prompt_pool_tokens == 0);
  c.rl.prompt_pool_tokens = 333;
  CHECK(rollout_engine_config(c, m).prompt_pool_tokens == 333);
}

TEST_CASE("[rl]'s sampling and objective reach the requests and the trainer as configured") {
  run_config c;
  c.rl.temperature = 0.7;
  c.rl.top_k = 5;
  c.rl.top_p = 0.9;
  c.rl.max_new_tokens = 17;
  auto s = rollout_sampling(c, 42);
  CHECK(s.temperature == doctest::Approx(0.7));
  CHECK(s.top_k == 5);
  CHECK(s.top_p == doctest::Approx(0.9));
  CHECK(s.max_new_tokens == 17);
  CHECK(s.stop_tokens == std::vector<int32_t>{42});
  c.rl.lr = 3e-4;
  c.rl.clip = 0.3;
  c.rl.ppo_minibatches = 3;
  c.rl.max_tokens_per_mb = 999;
  c.rl.decoupled = false;
  c.rl.kl_coef = 0.05;
  auto t = rl_trainer_config(c);
  CHECK(t.optimizer.lr == doctest::Approx(3e-4));
  CHECK(t.ppo.clip_low == doctest::Approx(0.3));
  CHECK(t.ppo.clip_high == doctest::Approx(0.3));
  CHECK(t.ppo_minibatches == 3);
  CHECK(t.max_tokens_per_mb == 999);
  CHECK_FALSE(t.ppo.decoupled);
  CHECK(t.kl_coef == doctest::Approx(0.05));
  CHECK(t.temperature == doctest::Approx(0.7));
  CHECK(t.data_parallel == 1);  // the job sets it from the node's cores
}

TEST_CASE(
    "a node computes on its devices, else on model.device, and a trainer's replicas take the GPUs after the first") {
  run_config c;
  node_spec n;
  c.model.device = "cuda:2";
  CHECK(job::node_devices(c, n) == std::vector<std::string>{"cuda:2"});
  n.devices = {"cuda:0", "cuda:1", "cuda:3"};
  CHECK(job::node_devices(c, n) == n.devices);
  CHECK(job::replica_devices(n.devices) == std::vector<std::string>{"cuda:1", "cuda:3"});
  CHECK(job::replica_devices({"cuda:1"}).empty());
  CHECK(job::replica_devices({"cpu"}).empty());  // the CPU's replicas are its threads
}

TEST_CASE("the progress line counts a resumed run's speed and ETA from where this process started") {
  controller_stats s;
  s.steps = 100;
  s.trained = 1600;
  s.reward_mean_last = 0.5;
  s.max_staleness = 2;
  // At the resume point itself: no step done here yet, so no ETA and no samples.
  job::progress_origin origin{job::clock_type::now() - std::chrono::seconds(10), 100, 1600};
  auto text = job::progress_text(s, 200, origin);
  CHECK(text.find("RL step 100/200 | 0 samples/s") == 0);
  CHECK(text.find("ETA ?") != std::string::npos);
  // 10 steps (160 samples) in about 10 s: 16 samples/s, 90 steps to go at 1 s each.
  s.steps = 110;
  s.trained = 1760;
  text = job::progress_text(s, 200, origin);
  INFO(text);
  CHECK(text.find("RL step 110/200 | 16 samples/s") == 0);
  CHECK(text.find("reward 0.5 | staleness <= 2 | ETA ") != std::string::npos);
  CHECK(text.find("ETA ?") == std::string::npos);
}

TEST_CASE("a rollout worker hands a checkpoint its work in flight, and a worker continues it from there") {
  fixture f;
  auto& self = *f.self;
  auto reference = f.model(1);
  auto worker = f.spawn(f.model(1));
  std::atomic<bool> release{false};
  auto pool = holding_pool(f, release);  // held until the test has looked
  struct release_at_exit {               // a failed check must not leave the pool holding for 30 s
    std::atomic<bool>& release;
    ~release_at_exit() { release = true; }
  } release_guard{release};
  trainer_actor no_trainer;
  auto store = spawn_sample_store(*f.sys, no_trainer);
  struct exit_at_end {  // a failed REQUIRE must not leave actors alive: the system would wait for them forever
    std::vector<caf::actor> actors;
    ~exit_at_end() {
      for (auto& a : actors)
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    }
  } exits{{caf::actor_cast<caf::actor>(worker), caf::actor_cast<caf::actor>(pool), caf::actor_cast<caf::actor>(store)}};
  auto send = [&](const generation_request& r) {
    self->send(worker, *pack(r), *pack(reward_task{}), caf::actor_cast<caf::actor>(pool),
               caf::actor_cast<caf::actor>(store));
  };
  auto slow = request(0, 80), quick = request(1, 2);  // one generates long, one is with the pool at once
  send(slow);
  send(quick);
  std::optional<trajectory> generating, generated;
  auto is = [](const trajectory& t, const generation_request& r) {
    return t.group_id == r.group_id && t.sample_index == r.sample_index;
  };
  // Polled often: the slow request's 80 steps of this small model take a few
  // milliseconds, and it must be seen before it ends. When it ended first (about
  // one run in 40), another slow request, on the same worker, is watched instead.
  // (The quick one, submitted second, may start a few steps late: seen once it is done.)
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (attempt > 0) {
      slow = request(static_cast<uint64_t>(2 * attempt + 2), 80);  // a group of its own
      send(slow);
    }
    generating.reset();
    for (int i = 0; i < 20000 && !(generating && generated && generating->output_tokens.size() >= 4 &&
                                   generated->finish != finish_reason::unfinished);
         ++i) {
      std::this_thread::sleep_for(200us);
      self->request(worker, 10s, snapshot_atom::value)
          .receive(
              [&](std::vector<packed<trajectory>>& parts) {
                generating.reset();
                generated.reset();
                for (auto& bytes : parts) {
                  auto t = *unpack(bytes);
                  if (is(t, slow))
                    generating = t;
                  else if (is(t, quick))
                    generated = t;
                }
              },
              [](caf::error& e) { FAIL(describe(e)); });
    }
    if (generating && generating->finish == finish_reason::unfinished)
      break;
  }
  REQUIRE(generating);
  REQUIRE(generated);
  auto slow_whole = direct(*reference, slow), quick_whole = direct(*reference, quick);
  CHECK(generating->finish == finish_reason::unfinished);
  auto n = generating->output_tokens.size();
  REQUIRE(n < slow_whole.tokens.size());
  CHECK(std::equal(generating->output_tokens.begin(), generating->output_tokens.end(), slow_whole.tokens.begin()));
  CHECK(generating->behaviour_logprobs.size() == n);
  CHECK(generated->output_tokens == quick_whole.tokens);  // generated, waiting for its score
  CHECK(generated->finish == quick_whole.finish);
  release = true;

  // Another worker (a resumed run) continues both from their saved work.
  auto next = f.spawn(f.model(1));
  exits.actors.push_back(caf::actor_cast<caf::actor>(next));
  auto continued = [&](const generation_request& r, const trajectory& saved) {
    auto again = r;
    again.so_far = {saved.output_tokens, saved.behaviour_logprobs, saved.token_versions, saved.finish};
    trajectory out;
    self->request(next, 30s, *pack(again))
        .receive([&](packed<trajectory>& t, std::string&) { out = *unpack(t); },
                 [](caf::error& e) { FAIL(describe(e)); });
    return out;
  };
  auto slow_out = continued(slow, *generating);
  CHECK(slow_out.output_tokens == slow_whole.tokens);
  CHECK(std::equal(generating->behaviour_logprobs.begin(), generating->behaviour_logprobs.end(),
                   slow_out.behaviour_logprobs.begin()));
  auto quick_out = continued(quick, *generated);
  CHECK(quick_out.output_tokens == quick_whole.tokens);
  CHECK(quick_out.behaviour_logprobs == generated->behaviour_logprobs);  // not generated again
}

TEST_CASE("cancelled by the controller, a rollout worker ends every request bound for a pool and holds none of them") {
  fixture f;
  auto& self = *f.self;
  auto worker = f.spawn(f.model(1));
  std::atomic<bool> release{false};
  auto pool = holding_pool(f, release);
  trainer_actor no_trainer;
  auto store = spawn_sample_store(*f.sys, no_trainer);
  auto snapshot_size = [&] {
    size_t n = 0;
    self->request(worker, 10s, snapshot_atom::value)
        .receive([&](std::vector<packed<trajectory>>& parts) { n = parts.size(); },
                 [](caf::error& e) { FAIL(describe(e)); });
    return n;
  };
  for (auto& r : {request(0, 80), request(1, 2), request(2, 80)})
    self->send(worker, *pack(r), *pack(reward_task{}), caf::actor_cast<caf::actor>(pool),
               caf::actor_cast<caf::actor>(store));
  for (int i = 0; i < 2000 && snapshot_size() < 3; ++i)
    std::this_thread::sleep_for(5ms);
  REQUIRE(snapshot_size() == 3);  // two generating, one with the pool
  self->send(worker, cancel_atom::value);
  int errors = 0;
  for (int i = 0; i < 3; ++i)
    self->receive([&](sample_summary&) { FAIL("a cancelled request was answered with a summary"); },
                  [&](caf::error&) { ++errors; }, caf::after(30s) >> [] { FAIL("no answer within 30 s"); });
  CHECK(errors == 3);
  CHECK(snapshot_size() == 0);
  release = true;
  for (auto a :
       {caf::actor_cast<caf::actor>(worker), caf::actor_cast<caf::actor>(pool), caf::actor_cast<caf::actor>(store)})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}
