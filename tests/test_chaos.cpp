// The chaos run: the four-process run of test_cluster (controller and trainer,
// a reward node, two rollout nodes, on loopback over mutual TLS) while a seeded
// schedule injects faults. From outside: SIGKILL of rollout and reward nodes,
// SIGSTOP/SIGCONT pauses longer than the connection timeout, and every node
// that died started again under its own name. From inside, through failpoints
// (runtime/failpoints.hpp): verifications that hang until the reward pool's
// deadline, and bulk weight transfers cut half-way. The same run without
// faults goes first, for the wall time and the accuracy.
//
// Judged by the run's ledger against the test's own record: every admitted
// sample trained or dropped with a reason (the step lines' samples add up to
// the trained count, the drop reasons to the dropped count), no prompt trained
// twice, the staleness bound kept, every process ended by itself, at least
// half the calm run's accuracy gain. CI runs the default schedule (20 faults from
// outside plus the failpoints'); tests/chaos/run_long.sh runs a longer one:
//   AREAL_CHAOS_FAULTS (default 20)  faults from outside
//   AREAL_CHAOS_SEED   (default 1)   the schedule's seed
//   AREAL_CHAOS_STEPS  (default 40 + 16 per fault)  steps of each run
#include <doctest/doctest.h>

#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include "cluster_run.hpp"

using namespace areal::test;
using namespace std::chrono_literals;

namespace {

int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// One run of the cluster and what the test saw of it.
struct run_record {
  double wall_s = 0;
  nlohmann::json summary;
  std::map<std::string, int> faults;  // by kind
  int restarts = 0;                   // nodes started again under their own name
  int hung = 0;                       // processes still running 60 s after the head ended
  int trained_twice = 0;              // prompt positions in more than one step
  std::map<int, int> ended_codes;     // of the replaced processes: how many ended with each code
};

struct chaos_setup {
  int faults = 0;  // from outside; 0: the calm run
  uint64_t seed = 1;
};

// How many times `text` occurs in `log`.
int occurrences(const std::string& log, const std::string& text) {
  int n = 0;
  for (auto at = log.find(text); at != std::string::npos; at = log.find(text, at + 1))
    ++n;
  return n;
}

run_record run_cluster(const std::string& name, int64_t steps, const chaos_setup& chaos) {
  cluster c{name, steps};
  // Deadlines the faults meet within the run: a hung verification is given up
  // after a second, a cut transfer after three, a run without rollout workers
  // (both killed at once) waits 30 s for one to come back.
  // 512 held-out prompts (not the cluster's 128): the accuracy compared below moves 0.022 by sampling.
  for (auto s : {"reward.timeout_s=1", "cluster.transfer_timeout_ms=3000", "cluster.connect_timeout_s=30",
                 "rl.checkpoint_every=0", "eval.prompts=512"})
    c.settings.push_back(s);
  if (chaos.faults > 0) {
    setenv("AREAL_FAILPOINTS", "reward.verifier_hang=0.004,weights.transfer_cut=0.25", 1);
    setenv("AREAL_FAILPOINTS_SEED", std::to_string(chaos.seed).c_str(), 1);
  }
  run_record r;
  auto started = clock_type::now();
  std::map<std::string, std::unique_ptr<node_process>> live;
  std::vector<std::unique_ptr<node_process>> ended;  // kept for their logs and exit codes
  auto procs = c.start_all();
  for (size_t i = 0; i < nodes.size(); ++i)
    live[nodes[i]] = std::move(procs[i]);
  auto& head = *live["head"];
  // Whether a process still runs (node_process learns of an exit only when it waits for it).
  auto alive = [](node_process& p) { return !p.wait_exit(0ms); };
  std::map<std::string, int> generation;  // restarts per node, for the log names
  auto restart = [&](const std::string& node) {
    ended.push_back(std::move(live[node]));
    live[node] = c.start(node, node + "-again-" + std::to_string(++generation[node]));
    r.restarts++;
  };
  // Every node that ended (killed, or ended by itself after a pause) comes back under its name.
  auto restart_ended = [&] {
    for (auto& n : nodes)
      if (n != "head" && !alive(*live[n]))
        restart(n);
  };

  if (chaos.faults > 0) {
    std::mt19937_64 rng{chaos.seed};
    auto uniform = [&](double a, double b) { return std::uniform_real_distribution<double>{a, b}(rng); };
    // The joins take seconds (a warm start, the first weights): faults start once both rollout nodes worked.
    REQUIRE_MESSAGE(head.wait_for("a rollout worker joined from node gen-b", 120s), head.log());
    REQUIRE_MESSAGE(head.wait_for("a rollout worker joined from node gen-a", 120s), head.log());
    // Spread over the first 80% of the steps, so that the run does not end before its faults.
    double spread = 0.8 * static_cast<double>(steps) / chaos.faults;
    for (int i = 0; i < chaos.faults && alive(head); ++i) {
      auto due = static_cast<int64_t>(spread * i);
      auto until = clock_type::now() + 120s;
      while (alive(head) && c.steps_done() < due && clock_type::now() < until) {
        restart_ended();
        std::this_thread::sleep_for(50ms);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(uniform(300, 1500))));
      if (!alive(head))
        break;
      restart_ended();  // one that ended by itself since the last fault
      auto pick = uniform(0, 1);
      std::string node = pick < 0.6 ? (uniform(0, 1) < 0.5 ? "gen-a" : "gen-b") : "scorer";
      bool kill = uniform(0, 1) < 0.5;
      auto& p = *live[node];
      if (kill) {
        p.kill(SIGKILL);
        CHECK_MESSAGE(p.wait_exit(10s), node << " did not end at SIGKILL");
        r.faults[node == "scorer" ? "kill reward node" : "kill rollout node"]++;
      } else {
        // Longer than the connection timeout (1.5 s): the head counts the node as lost meanwhile.
        p.kill(SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(uniform(2000, 3500))));
        p.kill(SIGCONT);
        r.faults[node == "scorer" ? "pause reward node" : "pause rollout node"]++;
        std::this_thread::sleep_for(500ms);  // time to notice it was let go, and end
      }
      restart_ended();
    }
  }
  // The run ends by itself; a node that ends meanwhile is started again so that the run can finish.
  auto deadline = clock_type::now() + 120s + steps * 3s;
  while (head.running() && clock_type::now() < deadline) {
    if (!head.wait_exit(200ms))
      restart_ended();
  }
  auto head_code = head.wait_exit(0ms);
  r.wall_s = seconds_since(started);
  REQUIRE_MESSAGE(head_code == 0, head.log() << "\n(every node's log is in " << c.dir.path.string()
                                             << " when the environment sets AREAL_TEST_KEEP)");
  for (auto& n : nodes)
    if (n != "head") {
      auto code = live[n]->wait_exit(60s);
      if (!code)
        r.hung++;
      CHECK_MESSAGE(code, n << " still runs 60 s after the run ended:\n" << live[n]->log());
    }
  for (auto& p : ended) {
    auto code = p->wait_exit(0ms);
    CHECK_MESSAGE(code, "a replaced process still runs");
    r.ended_codes[code ? *code : -1]++;
  }
  // The failpoints' faults, as the processes logged them.
  std::string logs;
  for (auto& p : ended)
    logs += p->log();
  for (auto& [n, p] : live)
    logs += p->log();
  r.faults["verifier hang"] = occurrences(logs, "failpoint reward.verifier_hang fired");
  r.faults["weight transfer cut"] = occurrences(logs, "failpoint weights.transfer_cut fired");
  unsetenv("AREAL_FAILPOINTS");
  unsetenv("AREAL_FAILPOINTS_SEED");

  // The ledger against the test's own record.
  r.summary = summary(c);
  auto steps_lines = check_steps(c, 2);  // staleness within the bound, no prompt trained twice
  CHECK(static_cast<int64_t>(steps_lines.size()) == steps);
  int64_t samples = 0;
  std::set<uint64_t> prompts;
  for (auto& m : steps_lines) {
    samples += m["samples"].get<int64_t>();
    for (auto& p : m["prompt_positions"])
      r.trained_twice += !prompts.insert(p.get<uint64_t>()).second;
  }
  nlohmann::json end;
  for (auto& m : c.metrics())
    if (m["event"] == "end")
      end = m;
  REQUIRE(end.is_object());
  int64_t dropped = 0;
  for (auto& [reason, n] : end["drop_reasons"].items())
    dropped += n.get<int64_t>();
  CHECK(samples == end["trained"].get<int64_t>());
  CHECK(dropped == end["dropped"].get<int64_t>());
  CHECK(r.summary["admitted"].get<int64_t>() == end["trained"].get<int64_t>() + end["dropped"].get<int64_t>());
  CHECK(r.summary["trained"] == end["trained"]);
  r.summary["drop_reasons"] = end["drop_reasons"];
  return r;
}

std::string describe_faults(const std::map<std::string, int>& faults) {
  std::ostringstream out;
  int total = 0;
  for (auto& [kind, n] : faults)
    total += n;
  out << total << " faults (";
  bool first = true;
  for (auto& [kind, n] : faults) {
    out << (first ? "" : ", ") << kind << " " << n;
    first = false;
  }
  out << ")";
  return out.str();
}

}  // namespace

TEST_CASE("chaos: a four-process run under a seeded schedule of faults loses nothing and hangs nowhere") {
  chaos_setup chaos;
  chaos.faults = static_cast<int>(env_or("AREAL_CHAOS_FAULTS", 20));
  chaos.seed = static_cast<uint64_t>(env_or("AREAL_CHAOS_SEED", 1));
  // A fault takes up to about 5.5 s of wall time (a pause of 2-3.5 s and the waits around it): at 10 steps a fault
  // the run of 240 steps under 20 faults ended once (50 s) before the last fault, on a loaded CI machine.
  auto steps = env_or("AREAL_CHAOS_STEPS", 40 + 16 * chaos.faults);
  REQUIRE(chaos.faults > 0);

  auto calm = run_cluster("chaos-calm", steps, {});
  auto wild = run_cluster("chaos", steps, chaos);

  int outside = 0, total = 0;
  for (auto& [kind, n] : wild.faults) {
    total += n;
    outside += kind.rfind("kill", 0) == 0 || kind.rfind("pause", 0) == 0 ? n : 0;
  }
  auto& s = wild.summary;
  int64_t lost = s["admitted"].get<int64_t>() - s["trained"].get<int64_t>() - s["dropped"].get<int64_t>();
  std::ostringstream report;
  report << std::fixed << std::setprecision(2) << "chaos (seed " << chaos.seed << ", " << steps
         << " steps): " << describe_faults(wild.faults) << "; " << wild.restarts
         << " node(s) started again under their own name (the replaced ones ended with exit codes";
  for (auto& [code, n] : wild.ended_codes)
    report << " " << code << " x" << n;
  report << ")\n"
         << "chaos: samples admitted " << s["admitted"] << ", trained " << s["trained"] << ", dropped "
         << s["dropped"] << " " << s["drop_reasons"].dump()  << "; lost " << lost << ", trained twice "
         << wild.trained_twice << ", hung processes " << wild.hung << "\n"
         << "chaos: wall " << wild.wall_s << " s vs " << calm.wall_s << " s without faults ("
         << wild.wall_s / calm.wall_s << "x); accuracy " << s["accuracy_before"].get<double>() << " -> "
         << s["accuracy_after"].get<double>() << " vs " << calm.summary["accuracy_after"].get<double>()
         << " without faults (which trained " << calm.summary["trained"] << " and dropped "
         << calm.summary["dropped"] << " " << calm.summary["drop_reasons"].dump() << ")";
  MESSAGE(report.str());
  std::cout << report.str() << "\n";

  CHECK_MESSAGE(outside == chaos.faults, "the run ended after " << outside << " of " << chaos.faults
                                                                << " faults: give it more steps (AREAL_CHAOS_STEPS)");
  CHECK(total >= chaos.faults);
  CHECK(lost == 0);
  CHECK(wild.trained_twice == 0);
  CHECK(wild.hung == 0);
  CHECK(calm.hung == 0);
  // The faults cost some learning, not most of it: the run under faults gains at least half the
  // accuracy the calm run gained. Neither run is repeatable to the sample (asynchronous), and the
  // faults change what is trained when: seven pairs of the CI schedule (then 128 evaluation
  // prompts) ended 0.20 below to 0.11 above the calm run (gains 0.35 against 0.55 at the worst, a
  // ratio of 0.64); a fixed margin of 0.19 failed once in CI. Corrupted weights or a broken sample
  // path stay near the 0.11 they start from.
  auto gain = s["accuracy_after"].get<double>() - s["accuracy_before"].get<double>();
  auto calm_gain = calm.summary["accuracy_after"].get<double>() - calm.summary["accuracy_before"].get<double>();
  CHECK_MESSAGE(calm_gain > 0.1, report.str());
  CHECK_MESSAGE(gain >= 0.5 * calm_gain, report.str());
}
