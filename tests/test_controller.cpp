// The controller's protocol, deterministically: CAF's test coordinator runs
// every actor on the test's thread, and fake rollout workers, reward pools and
// trainers keep the test's own record of what they saw. Loss of a member,
// retries, a lost reward pool, the end of the run, the staleness gate at the moment
// of admission, and the ledger against the independent record.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "areal/actors/controller.hpp"
#include "areal/actors/sample_store.hpp"
#include "node_process.hpp"

using namespace areal;
using areal::test::scratch_dir;

namespace {

using key = std::pair<uint64_t, uint32_t>;  // (group, index)

// What the fakes saw: the test's own record, kept apart from the controller's ledger.
struct record {
  std::vector<generation_request> requests;  // every generation request, in arrival order
  std::set<key> generated;                   // answered with a trajectory
  std::vector<key> trained;                  // in the batches the trainer trained, in order
  std::vector<int64_t> checkpoints;          // versions saved
  int64_t version = 0;                       // the trainer's
  int64_t reward_requests = 0;
  bool done = false;
  int32_t code = -1;
  std::string why;
  // A hung trainer: it takes the request and never answers (no promise kept, so none is broken).
  bool hang_training = false, hang_checkpoints = false, hang_evaluations = false;
  int64_t evaluations = 0;
  // A slow disk: the trainer holds its copy of each checkpoint, and says it is on
  // disk only when the test tells it (as its writer thread would).
  bool hold_writes = false;
  std::vector<caf::typed_response_promise<int64_t>> writes;
};

// How a fake rollout worker answers a request (the default: a trajectory at once).
enum class answer { trajectory, fail, hold, aborted };

struct rollout_behaviour {
  std::function<answer(const generation_request&, int attempt)> decide = [](auto&, int) { return answer::trajectory; };
};

rollout_actor fake_rollout(caf::actor_system& sys, std::shared_ptr<record> rec, rollout_behaviour how) {
  return sys.spawn([rec, how](rollout_actor::pointer self) -> rollout_actor::behavior_type {
    auto attempts = std::make_shared<std::map<key, int>>();
    auto held = std::make_shared<std::vector<caf::typed_response_promise<sample_summary>>>();
    return {
        [=](packed<generation_request>& msg, packed<reward_task>& task, caf::actor& pool,
            caf::actor& store) -> caf::result<sample_summary> {
          auto r = *unpack(msg);
          rec->requests.push_back(r);
          key k{r.group_id, r.sample_index};
          auto what = how.decide(r, ++(*attempts)[k]);
          if (what == answer::fail)
            return caf::make_error(caf::sec::runtime_error, "fake failure");
          if (what == answer::hold) {
            held->push_back(self->make_response_promise<sample_summary>());
            return held->back();
          }
          trajectory t;
          t.prompt_id = r.prompt_id;
          t.group_id = r.group_id;
          t.sample_index = r.sample_index;
          t.prompt_tokens = r.prompt_tokens;
          t.output_tokens = {1, 2, 3};
          t.behaviour_logprobs = {-0.5f, -0.5f, -0.5f};
          t.token_versions = std::vector<int64_t>(3, r.admitted_version);
          t.finish = what == answer::aborted ? finish_reason::aborted : finish_reason::stop;
          t.producer = "fake";
          rec->generated.insert(k);
          // On as the real worker sends it: to the pool, which hands it to the store.
          return self->delegate(caf::actor_cast<reward_pool_actor>(pool), *pack(t), std::string{"3"}, task, store);
        },
        [](packed<generation_request>&) -> caf::result<packed<trajectory>, std::string> {
          return caf::make_error(caf::sec::unexpected_message, "the controller asks for generation with scoring");
        },
        [](stream_atom, packed<generation_request>&, caf::actor&) -> caf::result<packed<trajectory>, std::string> {
          return caf::make_error(caf::sec::unexpected_message, "only the endpoint streams");
        },
        [](cancel_atom, caf::actor&) {},
        [](cancel_atom) {},
        [](local_weights&) {},
        [](step_atom) {},
        [](caf::tick_atom) {},
        [](snapshot_atom) { return std::vector<packed<trajectory>>{}; },
        [rec](weights_atom) { return rec->version; },
    };
  });
}

// A reward pool that scores even sample indices correct; with `hold`, it never answers.
reward_pool_actor fake_reward(caf::actor_system& sys, std::shared_ptr<record> rec, bool hold) {
  return sys.spawn([rec, hold](reward_pool_actor::pointer self) -> reward_pool_actor::behavior_type {
    auto held = std::make_shared<std::vector<caf::typed_response_promise<sample_summary>>>();
    return {
        [=](packed<trajectory>&, std::string&, packed<reward_task>&) -> caf::result<packed<trajectory>> {
          return caf::make_error(caf::sec::unexpected_message, "the controller's samples go on to the store");
        },
        [=](packed<trajectory>& msg, std::string&, packed<reward_task>&,
            caf::actor& store) -> caf::result<sample_summary> {
          ++rec->reward_requests;
          if (hold) {
            held->push_back(self->make_response_promise<sample_summary>());
            return held->back();
          }
          auto t = *unpack(msg);
          t.reward = t.sample_index % 2 == 0 ? 1.0f : 0.0f;
          t.judged = t.reward > 0 ? verdict::correct : verdict::wrong;
          return self->delegate(caf::actor_cast<sample_store_actor>(store), *pack(t));
        },
        [](stats_atom) { return reward_pool_stats{}; },
    };
  });
}

trainer_actor fake_trainer(caf::actor_system& sys, std::shared_ptr<record> rec) {
  return sys.spawn([rec](trainer_actor::pointer self) -> trainer_actor::behavior_type {
    return {
        [=](train_atom, local_batch& batch) -> caf::result<train_report> {
          if (rec->hang_training) {
            return caf::delegated<train_report>{};
          }
          train_report report;
          for (auto& t : *batch.trajectories) {
            rec->trained.emplace_back(t.group_id, t.sample_index);
            for (auto v : t.token_versions)
              report.max_staleness = std::max(report.max_staleness, rec->version - v);
          }
          report.version = ++rec->version;
          report.samples = static_cast<int64_t>(batch.trajectories->size());
          return report;
        },
        [=](weights_atom) {
          return local_weights{rec->version, nullptr};
        },
        [=](eval_atom) -> caf::result<int64_t, double, double> {
          rec->evaluations++;
          if (rec->hang_evaluations) {
            return caf::delegated<int64_t, double, double>{};
          }
          return caf::make_error(caf::sec::unexpected_message, "no evaluator");
        },
        [=](checkpoint_atom, std::string&, std::string&) -> caf::result<int64_t> {
          if (rec->hang_checkpoints) {
            return caf::delegated<int64_t>{};
          }
          rec->checkpoints.push_back(rec->version);
          return rec->version;
        },
        [=](durable_atom) -> caf::result<int64_t> {
          if (rec->hold_writes) {
            rec->writes.push_back(self->make_response_promise<int64_t>());
            return rec->writes.back();
          }
          return rec->checkpoints.back();
        },
        [=](durable_atom, int64_t version, std::string&) {  // as the writer thread says it is done
          if (!rec->writes.empty()) {
            rec->writes.front().deliver(version);
            rec->writes.erase(rec->writes.begin());
          }
        },
    };
  });
}

done_listener_actor listener(caf::actor_system& sys, std::shared_ptr<record> rec) {
  return sys.spawn([rec](done_listener_actor::pointer) -> done_listener_actor::behavior_type {
    return {[rec](done_atom, int32_t code, std::string& why) {
      rec->done = true;
      rec->code = code;
      rec->why = why;
    }};
  });
}

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  std::shared_ptr<record> rec = std::make_shared<record>();
  scratch_dir dir{"controller"};

  fixture() {
    cfg.add_message_types<caf::id_block::areal>();
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
  }

  controller_setup setup(int64_t group_size, int64_t batch_size, int64_t eta, int64_t steps) {
    controller_setup cs;
    tasks::running_sum_options o;
    o.seed = 3;
    cs.source = tasks::running_sum_generator(o);
    cs.encode = [](const std::string& text) { return std::vector<int32_t>(text.begin(), text.end()); };
    cs.group_size = group_size;
    cs.batch_size = batch_size;
    cs.eta = eta;
    cs.max_concurrent = 1000;
    cs.rollout_slots = 1000;
    cs.total_steps = steps;
    cs.trainer = keep(fake_trainer(*sys, rec));
    cs.store = keep(spawn_sample_store(*sys, cs.trainer));
    cs.metrics_path = (dir.path / "metrics.jsonl").string();
    cs.checkpoint_dir = (dir.path / "checkpoint").string();
    cs.request_timeout = std::chrono::hours(1);
    cs.listener = keep(listener(*sys, rec));
    return cs;
  }

  // Every actor the test spawned is stopped at its end, so that the actor system can shut down.
  std::vector<caf::actor> spawned;
  template <class Handle>
  Handle keep(Handle h) {
    spawned.push_back(caf::actor_cast<caf::actor>(h));
    return h;
  }
  rollout_actor rollout(rollout_behaviour how = {}) { return keep(fake_rollout(*sys, rec, how)); }
  reward_pool_actor reward(bool hold = false) { return keep(fake_reward(*sys, rec, hold)); }
  controller_actor controller(controller_setup cs) { return keep(spawn_controller(*sys, std::move(cs))); }
  ~fixture() {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::kill);
    run();
    // A request's deadline holds its requester until it fires (an unanswered request to a hung trainer).
    sched->advance_time(std::chrono::hours(2));
    run();
  }

  // Runs every actor until nothing is left to do (bounded).
  void run() {
    for (int i = 0; i < 100 && sched->run() > 0; ++i) {
    }
  }

  template <class T, class... Ts>
  T ask(const controller_actor& controller, Ts... xs) {
    auto out = std::make_shared<T>();
    sys->spawn([=](caf::event_based_actor* self) {
      self->request(controller, caf::infinite, xs...).then([=](T& x) { *out = x; });
    });
    run();
    return *out;
  }

  // The ledger as (group, index) -> entry.
  std::map<key, nlohmann::json> ledger(const controller_actor& controller) {
    std::map<key, nlohmann::json> out;
    for (auto& e : nlohmann::json::parse(ask<std::string>(controller, ledger_atom::value)))
      out[{e[0].get<uint64_t>(), e[1].get<uint32_t>()}] = e;
    return out;
  }

  nlohmann::json end_line() {
    std::ifstream in(dir.path / "metrics.jsonl");
    nlohmann::json end;
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["event"] == "end")
        end = j;
    }
    return end;
  }
};

}  // namespace

TEST_CASE("the ledger agrees with the record the rollout side and the trainer kept") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 6);
  cs.rollouts = {f.rollout({})};
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 0);
  CHECK(f.rec->why == "run complete");
  REQUIRE(f.rec->trained.size() == 6u * 8);
  std::set<key> trained(f.rec->trained.begin(), f.rec->trained.end());
  CHECK(trained.size() == f.rec->trained.size());  // no sample trained twice
  std::set<key> seen;
  for (auto& r : f.rec->requests)
    seen.emplace(r.group_id, r.sample_index);
  auto ledger = f.ledger(controller);
  CHECK(ledger.size() == seen.size());  // every admitted sample reached a rollout worker, and no other
  int64_t ledger_trained = 0;
  for (auto& [k, e] : ledger) {
    CHECK(seen.count(k) == 1);
    bool was_trained = e[2] == "trained";
    ledger_trained += was_trained;
    CHECK_MESSAGE(was_trained == (trained.count(k) == 1), "sample " << k.second << " of group " << k.first);
    if (!was_trained)
      CHECK(e[2] == "dropped");  // at the end every sample is final
  }
  CHECK(ledger_trained == static_cast<int64_t>(trained.size()));
  auto stats = f.ask<controller_stats>(controller, stats_atom::value);
  CHECK(stats.trained == static_cast<int64_t>(trained.size()));
  CHECK(stats.admitted == static_cast<int64_t>(seen.size()));
  CHECK(f.rec->checkpoints == std::vector<int64_t>{6});  // the final checkpoint
}

TEST_CASE("steps go on while a checkpoint is written, and the next checkpoint and the run's end wait for it") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 6);
  cs.checkpoint_every = 2;
  cs.rollouts = {f.rollout({})};
  cs.reward = f.reward();
  f.rec->hold_writes = true;
  auto trainer = cs.trainer;
  f.controller(std::move(cs));
  f.run();
  // Version 2's checkpoint is still being written: steps 3 and 4 trained meanwhile;
  // the checkpoint due at 4 waits for it, and holds the steps.
  CHECK(f.rec->checkpoints == std::vector<int64_t>{2});
  CHECK(f.rec->version == 4);
  REQUIRE(f.rec->writes.size() == 1);
  auto written = [&] {
    caf::anon_send(trainer, durable_atom::value, f.rec->checkpoints.back(), std::string{});
    f.run();
  };
  written();
  // Version 4's starts once 2's is on disk; steps 5 and 6 go on; the run's end
  // (its final checkpoint) waits for it.
  CHECK(f.rec->checkpoints == std::vector<int64_t>{2, 4});
  CHECK(f.rec->version == 6);
  CHECK_FALSE(f.rec->done);
  REQUIRE(f.rec->writes.size() == 1);
  written();
  CHECK(f.rec->checkpoints == std::vector<int64_t>{2, 4, 6});
  CHECK_FALSE(f.rec->done);  // until the final one is on disk
  REQUIRE(f.rec->writes.size() == 1);
  written();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 0);
  CHECK(f.rec->why == "run complete");
}

TEST_CASE("every sample is admitted within the staleness bound at the moment of admission") {
  for (int64_t eta : {0, 1, 3}) {
    INFO("eta " << eta);
    fixture f;
    const int64_t batch = 8;
    auto cs = f.setup(4, batch, eta, 10);
    cs.rollouts = {f.rollout({})};  // one worker: its requests arrive in admission order
    cs.reward = f.reward();
    f.controller(std::move(cs));
    f.run();
    REQUIRE(f.rec->done);
    int64_t i = 0;
    std::set<key> admitted;
    for (auto& r : f.rec->requests) {
      if (!admitted.emplace(r.group_id, r.sample_index).second)
        continue;  // generated again: admitted once
      ++i;
      CHECK_MESSAGE((i - 1) / batch <= r.admitted_version + eta,
                    "the " << i << "-th admission at version " << r.admitted_version);
    }
    CHECK(i >= 10 * batch);
  }
}

TEST_CASE("a run admits the samples its steps train and one batch more, whatever eta") {
  for (int64_t eta : {1, 3, 8}) {
    INFO("eta " << eta);
    fixture f;
    auto cs = f.setup(4, 8, eta, 6);
    cs.rollouts = {f.rollout({})};
    cs.reward = f.reward();
    f.controller(std::move(cs));
    f.run();
    REQUIRE(f.rec->done);
    CHECK(f.rec->why == "run complete");
    std::set<key> admitted;
    for (auto& r : f.rec->requests)
      admitted.emplace(r.group_id, r.sample_index);
    CHECK(admitted.size() == (6u + 1) * 8);  // more would be generated to be thrown away
    auto end = f.end_line();
    CHECK(end["trained"].get<int64_t>() == 6 * 8);
    CHECK(end["dropped"].get<int64_t>() == 8);
  }
}

TEST_CASE("with weights published to other nodes, admission waits for each version to arrive there") {
  fixture f;
  const int64_t batch = 8;
  auto cs = f.setup(4, batch, 1, 4);  // eta 1
  cs.remote_weights = true;           // the trainer sends no delivery report: the test does, as a publisher would
  cs.rollouts = {f.rollout({})};
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  f.run();
  // eta + 1 batches admitted for version 0's weights, and trained; the workers still hold version 0.
  CHECK(f.rec->version == 2);
  CHECK(f.rec->requests.size() == 2 * batch);
  CHECK_FALSE(f.rec->done);
  auto deliver = [&](std::vector<weight_delivery> reports) {
    caf::anon_send(controller, std::move(reports));
    f.run();
  };
  deliver({{"gen-a", 1, "gloo", 0, 0.0, 0, {}}});
  CHECK(f.rec->requests.size() == 3 * batch);  // version 1 arrived: one batch more, trained into version 3
  CHECK(f.rec->version == 3);
  CHECK_FALSE(f.rec->done);
  // Version 3 settles with one subscriber lost meanwhile (no version) and one cut transfer: admission goes on.
  deliver({{"gen-a", 3, "gloo", 0, 0.0, 0, {}},
           {"gen-b", INT64_MAX, "", 0, 0.0, 0, "subscriber lost"},
           {"gen-c", 3, "gloo", 0, 0.0, 0, "transfer cut"}});
  CHECK(f.rec->done);
  CHECK(f.rec->why == "run complete");
  CHECK(f.rec->version == 4);
  CHECK(f.rec->requests.size() == 5 * batch);  // 4 steps and the spare batch, as without remote weights
  for (auto& r : f.rec->requests)
    CHECK(r.admitted_version <= 3);
}

TEST_CASE("a rollout node that reports a version gets work at once, and one that has not gets none until it settles") {
  fixture f;
  const int64_t batch = 8;
  auto cs = f.setup(4, batch, 1, 8);  // eta 1
  cs.remote_weights = true;
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  // Two rollout nodes, each counting the requests it gets.
  std::map<std::string, int> sent_to;
  for (std::string node : {"gen-a", "gen-b"}) {
    rollout_behaviour counting;
    counting.decide = [&sent_to, node](const generation_request&, int) {
      ++sent_to[node];
      return answer::trajectory;
    };
    caf::anon_send(controller, join_atom::value, node, std::string{"rollout"},
                   caf::actor_cast<caf::actor>(f.rollout(counting)));
  }
  f.run();
  // eta + 1 batches for version 0 (all to gen-a, the first to join); trained into version 2, which no node
  // holds yet.
  CHECK(f.rec->version == 2);
  REQUIRE(f.rec->requests.size() == 2 * batch);
  auto before = sent_to;
  // gen-a holds version 2 (its report, as the publisher forwards it): two batches more, all to gen-a,
  // while gen-b, still fetching, gets nothing.
  caf::anon_send(controller, weight_delivery{"gen-a", 2, "gloo", 0, 0.0, 0, {}});
  f.run();
  CHECK(f.rec->requests.size() == 4 * batch);
  CHECK(sent_to["gen-a"] == before["gen-a"] + 2 * static_cast<int>(batch));
  CHECK(sent_to["gen-b"] == before["gen-b"]);
  CHECK(f.rec->version == 4);
  // A failed or lost report raises nothing.
  caf::anon_send(controller, weight_delivery{"gen-b", 4, "gloo", 0, 0.0, 0, "transfer cut"});
  caf::anon_send(controller, weight_delivery{"gen-b", INT64_MAX, "", 0, 0.0, 0, "subscriber lost"});
  f.run();
  CHECK(f.rec->requests.size() == 4 * batch);
  CHECK(sent_to["gen-b"] == 0);
  // Version 4 settles for everyone: the run goes on and ends, every request within the bound of the
  // version its node held (the i-th admitted sample: floor((i - 1) / batch) <= held + eta).
  caf::anon_send(controller, std::vector<weight_delivery>{{"gen-a", 4, "gloo", 0, 0.0, 0, {}},
                                                          {"gen-b", 4, "gloo", 0, 0.0, 0, {}}});
  f.run();
  caf::anon_send(controller, std::vector<weight_delivery>{{"gen-a", 8, "gloo", 0, 0.0, 0, {}},
                                                          {"gen-b", 8, "gloo", 0, 0.0, 0, {}}});
  f.run();
  CHECK(f.rec->done);
  CHECK(f.rec->why == "run complete");
  CHECK(f.rec->version == 8);
}

TEST_CASE("a sample that no member ever answers is reported where it is, not lost") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 4);
  rollout_behaviour swallow;
  swallow.decide = [](const generation_request& r, int) {
    return r.group_id == 0 && r.sample_index == 1 ? answer::hold : answer::trajectory;
  };
  cs.rollouts = {f.rollout(swallow)};
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  f.run();
  REQUIRE(f.rec->done);
  auto end = f.end_line();
  REQUIRE_MESSAGE(end.contains("unfinished"), end.dump());
  bool reported = false;
  for (auto& u : end["unfinished"])
    reported = reported || u.get<std::string>() == "sample 1 of group 0: generating at rollout-0 (1 attempt(s))";
  CHECK_MESSAGE(reported, end.dump());
  auto ledger = f.ledger(controller);
  CHECK(ledger[{0, 1}][2] == "dropped");
  CHECK(ledger[{0, 1}][6].get<std::string>().find("run ended before it was trained") == 0);
  CHECK(ledger[{0, 0}][2] == "dropped");  // its group never completed
}

TEST_CASE("a request past its deadline is generated again and a late reply is let go") {
  fixture f;
  auto cs = f.setup(4, 8, 0, 3);  // synchronous: the first batch needs the held samples
  cs.request_timeout = std::chrono::seconds(5);
  rollout_behaviour slow;
  slow.decide = [](const generation_request& r, int attempt) {
    if (r.group_id == 0 && r.sample_index == 1)
      return answer::hold;  // never answered: 3 deadlines, then dropped
    if (r.group_id == 1 && r.sample_index == 2 && attempt == 1)
      return answer::hold;  // answered on its second attempt
    return answer::trajectory;
  };
  cs.rollouts = {f.rollout(slow)};
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  f.run();
  CHECK_FALSE(f.rec->done);  // waiting for the held samples
  // Each deadline passes in virtual time: the held requests are sent again.
  for (int i = 0; i < 10 && !f.rec->done; ++i) {
    f.sched->advance_time(std::chrono::seconds(5));
    f.run();
  }
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 0);
  int attempts_01 = 0, attempts_12 = 0;
  for (auto& r : f.rec->requests) {
    attempts_01 += r.group_id == 0 && r.sample_index == 1 ? 1 : 0;
    attempts_12 += r.group_id == 1 && r.sample_index == 2 ? 1 : 0;
  }
  CHECK(attempts_01 == 3);
  CHECK(attempts_12 == 2);
  auto ledger = f.ledger(controller);
  CHECK(ledger[{0, 1}][2] == "dropped");
  CHECK(ledger[{0, 1}][6] == "rollout worker: no reply within the request timeout (3 attempts)");
  CHECK(ledger[{1, 2}][2] == "trained");
  CHECK(ledger[{1, 2}][4] == 2);
}

TEST_CASE("failed generations are retried, and dropped with the reason after three failures") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 4);
  rollout_behaviour flaky;
  flaky.decide = [](const generation_request& r, int attempt) {
    if (r.group_id == 2 && r.sample_index == 0)
      return answer::fail;  // always
    if (r.sample_index == 3 && attempt == 1)
      return answer::fail;  // once
    if (r.group_id == 1 && r.sample_index == 2 && attempt == 1)
      return answer::aborted;  // an unfinished trajectory is never trained
    return answer::trajectory;
  };
  cs.rollouts = {f.rollout(flaky)};
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 0);
  auto ledger = f.ledger(controller);
  CHECK(ledger[{0, 3}][2] == "trained");
  CHECK(ledger[{0, 3}][4] == 2);  // attempts
  CHECK(ledger[{2, 0}][2] == "dropped");
  CHECK(ledger[{2, 0}][4] == 3);
  CHECK(ledger[{2, 0}][6].get<std::string>().find("fake failure (3 attempts)") != std::string::npos);
  CHECK(ledger[{2, 1}][2] == "dropped");  // its group is dropped whole
  CHECK(ledger[{2, 1}][6] == ledger[{2, 0}][6]);
  CHECK(ledger[{1, 2}][2] == "dropped");
  CHECK(ledger[{1, 2}][6].get<std::string>().find("aborted") != std::string::npos);
  for (auto& k : f.rec->trained)
    CHECK(k != key{1, 2});
}

TEST_CASE("a lost rollout worker's samples are generated by another, none twice") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 4);
  rollout_behaviour hold_all;
  hold_all.decide = [](auto&, int) { return answer::hold; };
  auto doomed = f.rollout(hold_all);
  auto healthy = f.rollout({});
  cs.rollouts = {doomed};
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  f.run();
  CHECK(!f.rec->done);
  auto held = f.rec->requests.size();
  CHECK(held == 16);  // (eta + 1) * B admitted, all with the doomed worker
  caf::anon_send(controller, join_atom::value, std::string{"node-b"}, std::string{"rollout"},
                 caf::actor_cast<caf::actor>(healthy));
  f.run();
  CHECK(!f.rec->done);  // the doomed worker holds group 0..3: no group completes
  caf::anon_send_exit(doomed, caf::exit_reason::kill);
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 0);
  std::set<key> trained(f.rec->trained.begin(), f.rec->trained.end());
  CHECK(trained.size() == f.rec->trained.size());
  CHECK(trained.size() == 4u * 8);
  auto ledger = f.ledger(controller);
  CHECK(ledger[{0, 0}][2] == "trained");
  CHECK(ledger[{0, 0}][4] == 2);  // sent to the doomed worker, then to the healthy one
}

TEST_CASE("a lost reward pool's samples are generated again and scored by another, none twice") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 4);
  cs.rollouts = {f.rollout({})};
  auto doomed = f.reward(true);  // takes every sample and never answers
  cs.reward = doomed;
  auto controller = f.controller(std::move(cs));
  f.run();
  CHECK(!f.rec->done);
  CHECK(f.rec->reward_requests == 16);  // (eta + 1) * B admitted, all held by the doomed pool
  auto healthy = f.reward();
  caf::anon_send(controller, join_atom::value, std::string{"scorer"}, std::string{"reward"},
                 caf::actor_cast<caf::actor>(healthy));
  f.run();
  CHECK(!f.rec->done);  // the samples held by the doomed pool keep their groups open
  caf::anon_send_exit(doomed, caf::exit_reason::kill);
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 0);
  std::set<key> trained(f.rec->trained.begin(), f.rec->trained.end());
  CHECK(trained.size() == f.rec->trained.size());
  CHECK(trained.size() == 4u * 8);
  auto ledger = f.ledger(controller);
  CHECK(ledger[{0, 0}][2] == "trained");
  CHECK(ledger[{0, 0}][4] == 2);  // generated again after its pool was lost
  CHECK(ledger[{0, 0}][3] == "");
}

TEST_CASE("a stop during a step ends the run after it, with a checkpoint, and every sample final") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 50);
  cs.rollouts = {f.rollout({})};
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  // Run until two steps were trained, then ask the run to stop.
  for (int i = 0; i < 10000 && f.rec->trained.size() < 16; ++i)
    f.sched->run_once();
  caf::anon_send(controller, shutdown_atom::value, std::string{"stopped by a signal"});
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 0);
  CHECK(f.rec->why == "stopped by a signal");
  REQUIRE(!f.rec->checkpoints.empty());
  CHECK(f.rec->checkpoints.back() == f.rec->version);
  CHECK(f.rec->version < 50);
  for (auto& [k, e] : f.ledger(controller))
    CHECK((e[2] == "trained" || e[2] == "dropped"));
}

TEST_CASE("a trainer that never finishes a step ends the run at the trainer deadline, saying so") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 5);
  cs.trainer_timeout = std::chrono::seconds(30);
  cs.rollouts = {f.rollout({})};
  cs.reward = f.reward();
  f.rec->hang_training = true;
  auto controller = f.controller(std::move(cs));
  f.run();
  CHECK_FALSE(f.rec->done);  // the first step is in flight, and stays there
  f.sched->advance_time(std::chrono::seconds(29));
  f.run();
  CHECK_FALSE(f.rec->done);
  f.sched->advance_time(std::chrono::seconds(2));
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 1);
  CHECK_MESSAGE(
      f.rec->why == "the trainer failed: it did not finish training step 1 within 30 s (cluster.trainer_timeout_s)",
      f.rec->why);
  // The end line accounts for every admitted sample.
  for (auto& [k, e] : f.ledger(controller))
    CHECK((e[2] == "trained" || e[2] == "dropped"));
}

TEST_CASE("a checkpoint the trainer never writes ends the run at the deadline, and a hung evaluation is skipped") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 3);
  cs.trainer_timeout = std::chrono::seconds(30);
  cs.eval_every = 1;
  cs.rollouts = {f.rollout({})};
  cs.reward = f.reward();
  f.rec->hang_checkpoints = true;
  f.rec->hang_evaluations = true;
  f.controller(std::move(cs));
  f.run();
  // Every step trained (an evaluation in flight holds no step), then the final checkpoint hangs.
  CHECK(f.rec->version == 3);
  CHECK(f.rec->evaluations == 1);  // one at a time: the first one still holds the evaluator
  CHECK_FALSE(f.rec->done);
  f.sched->advance_time(std::chrono::seconds(31));
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 1);
  CHECK_MESSAGE(f.rec->why ==
                    "run complete; the final checkpoint failed (it did not write the "
                    "checkpoint within 30 s (cluster.trainer_timeout_s))",
                f.rec->why);
}

TEST_CASE("the member deadline counts from when the role went missing, anew each time it does") {
  using std::chrono::seconds;
  fixture f;
  auto cs = f.setup(4, 8, 1, 4);
  cs.rollouts = {f.rollout({})};
  cs.member_timeout = seconds(30);
  auto first = f.reward(true);  // pools that hold every sample: the run makes no step meanwhile
  cs.reward = first;
  auto controller = f.controller(std::move(cs));
  f.run();
  caf::anon_send_exit(first, caf::exit_reason::kill);  // missing from t = 0
  f.run();
  f.sched->advance_time(seconds(20));
  f.run();
  auto second = f.reward(true);  // back at t = 20
  caf::anon_send(controller, join_atom::value, std::string{"scorer"}, std::string{"reward"},
                 caf::actor_cast<caf::actor>(second));
  f.run();
  f.sched->advance_time(seconds(5));
  f.run();
  caf::anon_send_exit(second, caf::exit_reason::kill);  // missing again from t = 25
  f.run();
  f.sched->advance_time(seconds(10));  // t = 35: past the first absence's deadline, not this one's
  f.run();
  CHECK_MESSAGE(!f.rec->done, f.rec->why);
  f.sched->advance_time(seconds(19));  // t = 54
  f.run();
  CHECK_FALSE(f.rec->done);
  f.sched->advance_time(seconds(2));  // t = 56
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 1);
  CHECK_MESSAGE(f.rec->why.find("no reward pool for 30 s") == 0, f.rec->why);
}

TEST_CASE("a run with no reward pool stops at the member deadline, saying which role is missing") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 4);
  cs.rollouts = {f.rollout({})};
  cs.member_timeout = std::chrono::milliseconds(2000);
  f.controller(std::move(cs));
  f.run();
  CHECK(!f.rec->done);
  CHECK(f.rec->requests.empty());  // a sample goes out with a pool or not at all
  f.sched->trigger_timeouts();
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 1);
  CHECK_MESSAGE(f.rec->why.find("no reward pool for 2 s; start a node with the reward role") == 0, f.rec->why);
}

// A request no engine can take (the job refuses the settings that make one
// before it starts; a remote engine may still refuse), or a broken verifier:
// admitting and dropping forever would be a silent hang.
TEST_CASE("a run whose every sample fails stops with a reason instead of running forever") {
  fixture f;
  auto cs = f.setup(4, 8, 1, 4);
  rollout_behaviour broken;
  broken.decide = [](const generation_request&, int) { return answer::fail; };
  cs.rollouts = {f.rollout(broken)};
  cs.reward = f.reward();
  auto controller = f.controller(std::move(cs));
  f.run();
  REQUIRE(f.rec->done);
  CHECK(f.rec->code == 1);
  CHECK_MESSAGE(f.rec->why.find("samples all failed; the last one: rollout worker: fake failure (3 attempts)") !=
                    std::string::npos,
                f.rec->why);
  CHECK(f.rec->trained.empty());
  // Every sample the rollout side saw is accounted for as dropped, none lost.
  auto ledger = f.ledger(controller);
  for (auto& r : f.rec->requests) {
    auto it = ledger.find({r.group_id, r.sample_index});
    REQUIRE(it != ledger.end());
    CHECK(it->second[2] == "dropped");
  }
}
