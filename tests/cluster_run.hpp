// The four-process topology of configs/four_nodes.toml made CI-sized, on
// loopback ports over mutual TLS, for the multi-process tests (test_cluster,
// test_chaos): start and restart its nodes, read the run's metrics and summary,
// and check every trained step against the staleness bound and for prompts
// trained twice. Every wait is bounded.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "node_process.hpp"

namespace areal::test {

using namespace std::chrono_literals;

inline const std::vector<std::string> nodes = {"head", "scorer", "gen-a", "gen-b"};

// The settings of a CI-sized run (the micro model on sums of two or three terms) on any topology.
inline std::vector<std::string> micro_run(int64_t steps) {
  return {"model.preset=micro",
          "task.max_value=9",
          "task.median_terms=2.0",
          "task.max_terms=3",
          "task.truncated_fraction=0.5",
          "run.seed=3",
          "sft.steps=300",
          "sft.lr=3e-3",
          "rl.eta=2",
          "rl.steps=" + std::to_string(steps),
          "rl.batch_size=32",
          "rl.max_new_tokens=8",
          "rl.lr=3e-4",
          "rl.rollout_slots=32",
          "rl.max_concurrent=64",
          "eval.prompts=128",
          "reward.workers=1",
          "cluster.heartbeat_interval_ms=200",
          "cluster.connection_timeout_ms=1500",
          "cluster.connect_timeout_s=60"};
}

// The lines of a JSON-lines file (a run's metrics.jsonl).
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& file) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (!line.empty())
      lines.push_back(nlohmann::json::parse(line));
  return lines;
}

struct cluster {
  scratch_dir dir;
  std::vector<std::string> settings;

  cluster(const std::string& name, int64_t steps) : dir(name) {
    settings = micro_run(steps);
    settings.push_back("rl.checkpoint_every=4");
    settings.push_back("eval.every=0");
    auto ports = free_ports(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i)
      settings.push_back("nodes." + nodes[i] + ".port=" + std::to_string(ports[i]));
    // The topology asks for mutual TLS: the cluster's certificates first, as a user makes them.
    node_process certs({"--config", AREAL_SOURCE_DIR "/configs/four_nodes.toml", "--make-certs"},
                       dir.path / "certs.log", dir.path);
    REQUIRE(certs.wait_exit(30s) == 0);
  }

  std::unique_ptr<node_process> start(const std::string& node, const std::string& log_name,
                                      std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--config", AREAL_SOURCE_DIR "/configs/four_nodes.toml", "--node", node};
    for (auto& s : settings) {
      args.push_back("--set");
      args.push_back(s);
    }
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = std::make_unique<node_process>(args, dir.path / (log_name + ".log"), dir.path);
    REQUIRE(p->started());
    return p;
  }

  // Every node of the topology, the head first; logs NODE + suffix; `head_extra` for the head only.
  std::vector<std::unique_ptr<node_process>> start_all(const std::string& suffix = {},
                                                       std::vector<std::string> head_extra = {}) {
    std::vector<std::unique_ptr<node_process>> procs;
    for (auto& n : nodes)
      procs.push_back(start(n, n + suffix, n == "head" ? head_extra : std::vector<std::string>{}));
    return procs;
  }

  std::vector<nlohmann::json> metrics() const { return read_jsonl(dir.path / "runs/four-nodes/metrics.jsonl"); }

  int64_t steps_done() const {
    int64_t steps = 0;
    for (auto& m : metrics())
      steps += m["event"] == "step";
    return steps;
  }

  // Waits (bounded) until the run trained `steps` steps, or the head stopped.
  bool wait_for_steps(int64_t steps, node_process& head) const {
    auto deadline = std::chrono::steady_clock::now() + 120s;
    while (steps_done() < steps && std::chrono::steady_clock::now() < deadline && head.running())
      std::this_thread::sleep_for(50ms);
    return steps_done() >= steps;
  }
};

// Every trained batch within the staleness bound, no prompt trained twice;
// returns the step lines. After a crash, the steps trained after the last
// checkpoint were lost with the process: the resumed run (its "resume" line)
// trains them again, so the lines it supersedes are left out.
inline std::vector<nlohmann::json> check_steps(const cluster& c, int64_t eta) {
  std::vector<nlohmann::json> steps;
  for (auto& m : c.metrics()) {
    if (m["event"] == "resume") {
      auto kept = m["steps"].get<int64_t>();
      steps.erase(std::remove_if(steps.begin(), steps.end(),
                                 [&](const nlohmann::json& x) { return x["step"].get<int64_t>() > kept; }),
                  steps.end());
    }
    if (m["event"] == "step")
      steps.push_back(m);
  }
  std::set<uint64_t> prompts;
  for (auto& m : steps) {
    CHECK(m["staleness_trajectory_max"].get<int64_t>() <= eta);
    for (auto& p : m["prompt_positions"])
      CHECK(prompts.insert(p.get<uint64_t>()).second);
    for (auto& [producer, facts] : m["producers"].items())
      CHECK(facts["oldest_version"].get<int64_t>() >= m["version"].get<int64_t>() - 1 - eta);
  }
  return steps;
}

inline nlohmann::json summary(const cluster& c) {
  std::ifstream in(c.dir.path / "runs/four-nodes/summary.json");
  return nlohmann::json::parse(in);
}

}  // namespace areal::test
