// bench_rewards: verifications per second per worker for math (a fraction, and
// an expression that needs GiNaC), countdown and code (a trivial passing
// program, and three assertions run by the judge), measured (1) calling the verifier
// directly, on one thread and on every hardware thread at once, and (2) through the
// reward pool actor with 1 and with 2 workers, and
// the sandbox's overhead as a ratio over running the same program with plain
// python3 (fork + exec + wait, no isolation), all in one run. And what the
// process that asks costs the helper programs the reward service starts
// instead of forking it: a sandbox run's set-up by the supervisor program
// against a fork, from this process as it is and holding 2 GB more; the
// memory an algebra process holds after 2 GB of this process are rewritten
// (as a trainer's step does), as areal-algebra and as a fork.
// Usage: bench_rewards [--quick] [--json FILE]
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"

#include "areal/actors/node.hpp"
#include "areal/actors/reward_pool.hpp"
#include "areal/runtime/cpus.hpp"
#include "cas_process.hpp"      // the algebra process (runtime/src/reward)
#include "child_processes.hpp"  // tests/

extern char** environ;

using namespace areal;
using areal::bench::seconds_since;
using clock_type = std::chrono::steady_clock;

namespace {

struct workload {
  std::string name;
  reward_task task;
  std::string response;
};

std::vector<workload> workloads() {
  reward_task math;
  math.kind = task_kind::math;
  math.references = {"\\frac{3}{4}", "0.75"};
  reward_task expression;  // compared by GiNaC: neither side is a plain number
  expression.kind = task_kind::math;
  expression.references = {"\\frac{x+2}{7} + \\sqrt{12}"};
  reward_task countdown;
  countdown.kind = task_kind::countdown;
  countdown.numbers = {25, 50, 75, 100, 3, 6};
  countdown.target = 952;
  reward_task code;
  code.kind = task_kind::code;
  code.io_cases = {{"3\n", "9\n"}};
  reward_task assertions;
  assertions.kind = task_kind::code;
  assertions.assertions = {"assert square(3) == 9", "assert square(-2) == 4", "assert square(0) == 0"};
  std::string reasoning(2000, ' ');  // a response of typical length before its answer
  return {{"math", math, reasoning + "so the result is \\boxed{\\dfrac{3}{4}}."},
          {"math (expression, GiNaC)", expression, reasoning + "so \\boxed{\\frac{x}{7}+\\frac{2}{7}+2\\sqrt{3}}."},
          {"countdown", countdown, reasoning + "<answer>((100 + 6) * 3 * 75 - 50) / 25</answer>"},
          {"code", code, reasoning + "```python\nn = int(input())\nprint(n * n)\n```"},
          {"code (3 assertions: judge + program)", assertions,
           reasoning + "```python\ndef square(n):\n    return n * n\n```"}};
}

// Plain python3: fork + exec + wait, output to /dev/null.
double plain_python_s(const std::string& python, const std::string& script_path) {
  pid_t pid;
  std::vector<std::string> args{python, "-I", script_path};
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  auto start = clock_type::now();
  posix_spawn(&pid, python.c_str(), &actions, nullptr, argv.data(), environ);
  int status;
  waitpid(pid, &status, 0);
  posix_spawn_file_actions_destroy(&actions);
  return seconds_since(start);
}

// Resident size of this process (VmRSS), in MB.
long resident_mb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stol(line.substr(6)) / 1024;
  return -1;
}

// The same comparisons as builtin_comparison under another name: run_in_cas_process
// forks this process for any function but that one (the fallback where areal-algebra is missing).
reward::math::cas_answer forked_comparison(reward::math::cas_op op, const std::string& a, const std::string& b,
                                           double tolerance) {
  return reward::math::builtin_comparison(op, a, b, tolerance);
}

}  // namespace

int main(int argc, char** argv) {
  auto cli = bench::parse_options(argc, argv, "bench_rewards");
  bool quick = cli.quick;
  std::string json_path = cli.json_path;
  nlohmann::json out;
  const std::string python = "/usr/bin/python3";
  out["hardware_threads"] = std::thread::hardware_concurrency();
  out["usable_cpus"] = areal::cpus().usable();
  out["root"] = geteuid() == 0;
  std::cout << "machine: " << areal::cpus().describe() << "; running as "
            << (geteuid() == 0 ? "root (programs run as their own uids)" : "an unprivileged user") << "; " << python
            << "; this process resident " << resident_mb()
            << " MB; sandbox runs start the supervisor program, plain python3 is posix_spawn'ed\n";

  // Sandbox overhead on one trivial program.
  {
    reward::sandbox_request r;
    r.argv = {python, "-I", "main.py"};
    r.files = {{"main.py", "print(1)\n"}};
    auto probe = reward::run_sandboxed(r);
    for (auto& n : probe.notes)
      std::cout << "sandbox note: " << n << "\n";
    std::string script = "/tmp/areal-bench-" + std::to_string(getpid()) + ".py";
    std::ofstream(script) << "print(1)\n";
    int runs = quick ? 10 : 40;
    double plain = 0, boxed = 0;
    for (int i = 0; i < runs; ++i) {  // interleaved, so both see the same machine load
      plain += plain_python_s(python, script);
      auto start = clock_type::now();
      reward::run_sandboxed(r);
      boxed += seconds_since(start);
    }
    std::cout << "sandbox: print(1) takes " << 1e3 * boxed / runs << " ms sandboxed vs " << 1e3 * plain / runs
              << " ms with plain python3; overhead ratio " << boxed / plain << "\n";
    out["sandbox"] = {{"sandboxed_ms", 1e3 * boxed / runs}, {"plain_ms", 1e3 * plain / runs}, {"ratio", boxed / plain}};

    // What the process asking for runs costs them: in the job the reward workers
    // share a process with the trainer (weights, gradients, Adam moments). A run
    // set up by the supervisor program against one set up by forking this process
    // (the fallback where the program is missing: sandbox_policy::supervisor), as
    // the process is and with 2 GB more of touched memory, alternating.
    reward::sandbox_policy forking;
    forking.supervisor = "/nonexistent/areal-sandbox-supervisor";
    std::vector<char> held;
    for (size_t extra_mb : {size_t{0}, size_t{2048}}) {
      held.assign(extra_mb << 20, 1);
      double spawned = 0, forked = 0;
      for (int i = 0; i < runs; ++i) {
        auto start = clock_type::now();
        reward::run_sandboxed(r);
        spawned += seconds_since(start);
        start = clock_type::now();
        reward::run_sandboxed(r, forking);
        forked += seconds_since(start);
      }
      auto mb = resident_mb();
      std::cout << "sandbox from a process of " << mb << " MB: print(1) takes " << 1e3 * spawned / runs
                << " ms with the supervisor program vs " << 1e3 * forked / runs
                << " ms forking this process; forked/spawned " << forked / spawned << "\n";
      out["sandbox_host_memory"].push_back({{"resident_mb", mb},
                                            {"supervisor_ms", 1e3 * spawned / runs},
                                            {"fork_ms", 1e3 * forked / runs},
                                            {"ratio", forked / spawned}});
    }
    held = {};
    held.shrink_to_fit();

    // A reward thread's algebra process lives as long as the thread; beside the
    // trainer's 2 GB of weights and moments, rewritten by every step: what it
    // holds of them afterwards, as the areal-algebra program and as a fork.
    held.assign(size_t{2048} << 20, 1);
    for (bool program : {true, false}) {
      auto compare = program ? reward::math::builtin_comparison : forked_comparison;
      std::atomic<int> phase{0};
      reward::math::cas_result answer;
      std::thread reward_thread{[&] {
        answer = reward::math::run_in_cas_process(compare, reward::math::cas_op::equal, "(x-1)*(x+1)", "x^2-1", 0,
                                                  std::chrono::milliseconds(2000));
        phase = 1;
        while (phase != 2)
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }};
      while (phase != 1)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      for (size_t i = 0; i < held.size(); i += 4096)
        held[i] = static_cast<char>(held[i] + 1);  // an optimizer step: every page written
      long holds = 0;
      for (auto& c : child_processes())
        holds += c.resident_kb / 1024;
      phase = 2;
      reward_thread.join();
      if (answer.outcome != reward::math::cas_result::status::answered) {
        std::cerr << "bench_rewards: the algebra process did not answer\n";
        return 1;
      }
      std::cout << "algebra process " << (program ? "(areal-algebra)" : "(a fork of this process)") << " beside "
                << resident_mb() << " MB rewritten after it started: holds " << holds << " MB\n";
      out["algebra_process_mb"][program ? "program" : "fork"] = holds;
    }
    held = {};
    held.shrink_to_fit();

    // The assertion harness: a judge and the program in two sandboxed processes,
    // against plain python3 running the program and its assertions in one.
    auto task = workloads().back();
    std::ofstream(script) << "def square(n):\n    return n * n\n"
                          << [&] {
                               std::string all;
                               for (auto& a : task.task.assertions)
                                 all += a + "\n";
                               return all;
                             }();
    double plain_asserts = 0, judged = 0;
    for (int i = 0; i < runs; ++i) {
      plain_asserts += plain_python_s(python, script);
      auto start = clock_type::now();
      auto v = reward::score_response(task.response, task.task);
      judged += seconds_since(start);
      if (v.judged != verdict::correct) {
        std::cerr << "bench_rewards: the assertion task was judged " << to_string(v.judged) << ": " << v.detail << "\n";
        return 1;
      }
    }
    std::remove(script.c_str());
    std::cout << "harness: 3 assertions take " << 1e3 * judged / runs << " ms judged (judge + program, sandboxed) vs "
              << 1e3 * plain_asserts / runs << " ms with plain python3 (one process); overhead ratio "
              << judged / plain_asserts << "\n";
    out["harness"] = {{"judged_ms", 1e3 * judged / runs},
                      {"plain_ms", 1e3 * plain_asserts / runs},
                      {"ratio", judged / plain_asserts}};
  }

  // Direct calls on one thread.
  reward::scoring_options options;
  for (auto& w : workloads()) {
    int n = w.task.kind == task_kind::code ? (quick ? 20 : 100) : (quick ? 20000 : 200000);
    auto start = clock_type::now();
    int correct = 0;
    for (int i = 0; i < n; ++i)
      correct += reward::score_response(w.response, w.task, options).judged == verdict::correct;
    double rate = n / seconds_since(start);
    if (correct != n)
      std::cout << "WARNING: " << w.name << " judged " << correct << "/" << n << " correct\n";
    std::cout << w.name << ": " << rate << " verifications/s on one thread (direct call)\n";
    out["direct"][w.name] = rate;
  }

  // Direct calls on as many threads as the machine has: each thread's own rate (GiNaC goes to a
  // thread's algebra process when another thread is using it in this one).
  unsigned hardware = static_cast<unsigned>(std::max(2, areal::cpus().usable()));
  for (auto& w : workloads()) {
    if (w.task.kind == task_kind::code)
      continue;  // the sandbox's cost is per run, not per thread
    int n = quick ? 10000 : 100000;
    std::atomic<int> correct{0};
    auto start = clock_type::now();
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < hardware; ++t)
      threads.emplace_back([&] {
        for (int i = 0; i < n; ++i)
          correct += reward::score_response(w.response, w.task, options).judged == verdict::correct;
      });
    for (auto& t : threads)
      t.join();
    double per_thread = n / seconds_since(start);
    if (correct != n * static_cast<int>(hardware))
      std::cout << "WARNING: " << w.name << " judged " << correct << "/" << n * hardware << " correct\n";
    std::cout << w.name << ": " << per_thread << " verifications/s per thread with " << hardware
              << " threads calling directly; per-thread/one-thread ratio "
              << per_thread / out["direct"][w.name].get<double>() << "\n";
    out["direct_threads"][w.name] = per_thread;
  }

  // Through the pool actor, with 1 worker and with 2 (GiNaC is not thread-safe: its comparisons
  // take one process-wide lock, so expression workloads do not scale with workers).
  caf::actor_system_config cfg;
  configure_actor_system(cfg, cluster_spec{"bench"});
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  trajectory t;
  t.output_tokens = {1, 2, 3};
  t.behaviour_logprobs = {0, 0, 0};
  t.token_versions = {0, 0, 0};
  auto packed_traj = *pack(t);
  for (size_t workers : {1, 2}) {
    reward_pool_config pool_config;
    pool_config.workers = workers;
    pool_config.queue_capacity = 1024;
    auto pool = spawn_reward_pool(sys, pool_config);
    for (auto& w : workloads()) {
      int n = w.task.kind == task_kind::code ? (quick ? 20 : 100) : (quick ? 5000 : 50000);
      auto task = *pack(w.task);
      auto start = clock_type::now();
      int sent = 0, received = 0;
      while (received < n) {
        while (sent < n && sent - received < 256) {
          self->send(pool, packed_traj, w.response, task);
          ++sent;
        }
        self->receive([&](packed<trajectory>&) { ++received; },
                      [&](caf::error& e) {
                        std::cerr << "pool error: " << describe(e) << "\n";
                        std::exit(1);
                      });
      }
      double rate = n / seconds_since(start);
      double per_worker = rate / static_cast<double>(workers);
      double direct = out["direct"][w.name];
      std::cout << w.name << ": " << per_worker << " verifications/s per worker through the pool (" << workers
                << (workers == 1 ? " worker, " : " workers, ") << rate << " total); per-worker/direct ratio "
                << per_worker / direct << "\n";
      out["pool_per_worker"][std::to_string(workers)][w.name] = per_worker;
    }
    caf::anon_send_exit(pool, caf::exit_reason::user_shutdown);
  }
  if (!json_path.empty())
    std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
