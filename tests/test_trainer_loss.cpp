// The trainer on a node of its own (configs/three_nodes.toml) is SIGKILLed
// mid-run and started again: the controller pauses, the new trainer starts
// from the last checkpoint, the run goes back to it and finishes, and neither
// the head nor the rollout node is restarted. Every wait is bounded.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "cluster_run.hpp"

using namespace areal::test;
using namespace std::chrono_literals;

namespace {

struct three_nodes {
  scratch_dir dir{"trainer-loss"};
  std::vector<std::string> settings;

  explicit three_nodes(int64_t steps) {
    settings = micro_run(steps);
    settings.push_back("rl.checkpoint_every=4");
    settings.push_back("eval.every=0");
    settings.push_back("cluster.trainer_rejoin_s=60");
    settings.push_back("rl.record_trajectories=true");
    auto ports = free_ports(3);
    int index = 0;
    for (auto n : {"head", "trainer", "worker"})
      settings.push_back(std::string{"nodes."} + n + ".port=" + std::to_string(ports[index++]));
  }

  std::unique_ptr<node_process> start(const std::string& node, const std::string& log) {
    std::vector<std::string> args{"--config", AREAL_SOURCE_DIR "/configs/three_nodes.toml", "--node", node};
    for (auto& s : settings) {
      args.push_back("--set");
      args.push_back(s);
    }
    auto p = std::make_unique<node_process>(args, dir.path / (log + ".log"), dir.path);
    REQUIRE(p->started());
    return p;
  }

  std::filesystem::path run() const { return dir.path / "runs/three-nodes"; }

  std::vector<nlohmann::json> metrics() const { return read_jsonl(run() / "metrics.jsonl"); }

  int64_t last_step() const {
    int64_t step = 0;
    for (auto& m : metrics())
      if (m["event"] == "step")
        step = m["step"].get<int64_t>();
    return step;
  }
};

}  // namespace

TEST_CASE("the trainer's node killed mid-run joins again: the run goes back to its last checkpoint and finishes") {
  constexpr int64_t steps = 48;
  three_nodes t{steps};
  auto head = t.start("head", "head");
  auto trainer = t.start("trainer", "trainer");
  auto worker = t.start("worker", "worker");

  // Killed between two checkpoints (every 4 steps), after a few.
  auto deadline = std::chrono::steady_clock::now() + 150s;
  while (t.last_step() < 10 && std::chrono::steady_clock::now() < deadline && head->running())
    std::this_thread::sleep_for(20ms);
  REQUIRE_MESSAGE(t.last_step() >= 10, head->log());
  trainer->kill(SIGKILL);
  CHECK(trainer->wait_exit(10s) == 128 + SIGKILL);
  int64_t at_kill = t.last_step();
  auto record = t.run() / "trajectories.jsonl";
  auto lost_trainer_bytes = std::filesystem::file_size(record);
  REQUIRE_MESSAGE(head->wait_for("waiting up to 60 s for the trainer's node to join again", 20s), head->log());

  // A new trainer process under the same name; the head and the rollout node go on as they are.
  auto again = t.start("trainer", "trainer-again");
  REQUIRE_MESSAGE(head->wait_exit(180s) == 0, head->log() << "\n--- trainer ---\n" << again->log());
  CHECK_MESSAGE(again->wait_exit(15s) == 0, again->log());
  CHECK_MESSAGE(worker->wait_exit(15s) == 0, worker->log());

  auto log = head->log();
  CHECK(log.find("the trainer is lost") != std::string::npos);
  CHECK(log.find("a trainer joined again from the checkpoint of version") != std::string::npos);
  CHECK(log.find("every rollout worker has the weights of version") != std::string::npos);
  CHECK(again->log().find("resuming") != std::string::npos);
  CHECK(worker->log().find("weights: the controller node announced a new weight publisher; subscribing again") !=
        std::string::npos);

  // The run went back to a checkpoint at or before the kill and trained every step once from there.
  auto metrics = t.metrics();
  std::map<int64_t, int64_t> version_of_step;  // the steps that stand (those after a go-back are superseded)
  std::map<int64_t, std::vector<uint64_t>> prompts_of_step;
  int resumes = 0;
  int64_t back_to = -1;
  for (auto& m : metrics) {
    if (m["event"] == "resume") {
      resumes++;
      back_to = m["steps"].get<int64_t>();
      for (auto it = version_of_step.begin(); it != version_of_step.end();)
        it = it->first > back_to ? version_of_step.erase(it) : std::next(it);
      for (auto it = prompts_of_step.begin(); it != prompts_of_step.end();)
        it = it->first > back_to ? prompts_of_step.erase(it) : std::next(it);
    }
    if (m["event"] == "step") {
      version_of_step[m["step"].get<int64_t>()] = m["version"].get<int64_t>();
      prompts_of_step[m["step"].get<int64_t>()] = m["prompt_positions"].get<std::vector<uint64_t>>();
      CHECK(m["staleness_trajectory_max"].get<int64_t>() <= 2);
    }
  }
  CHECK(resumes == 1);
  CHECK(back_to > 0);
  CHECK(back_to <= at_kill);
  CHECK(back_to % 4 == 0);
  REQUIRE(static_cast<int64_t>(version_of_step.size()) == steps);
  for (auto& [step, version] : version_of_step)
    CHECK(version == step);
  // No prompt trained twice in the steps that stand (those after the checkpoint were undone with the lost trainer).
  std::set<uint64_t> prompts;
  for (auto& [step, positions] : prompts_of_step)
    for (auto p : positions)
      CHECK_MESSAGE(prompts.insert(p).second, "prompt " << p << " trained twice (step " << step << ")");

  // Every token the new trainer trained was sampled with weights of the history that stands: no
  // version newer than the step's (batch b of the new trainer is step back_to + b + 1, trained at
  // version back_to + b); a rollout worker that sampled on with the lost trainer's weights would break it.
  std::ifstream in(record);
  in.seekg(static_cast<std::streamoff>(lost_trainer_bytes));
  int64_t checked = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty())
      continue;
    auto r = nlohmann::json::parse(line);
    auto trained_at = back_to + r["batch"].get<int64_t>();
    for (auto v : r["token_versions"])
      CHECK_MESSAGE(v.get<int64_t>() <= trained_at, "a token of version " << v << " trained at version " << trained_at);
    ++checked;
  }
  CHECK(checked == (steps - back_to) * 32);

  auto s = nlohmann::json::parse(std::ifstream(t.run() / "summary.json"));
  MESSAGE("trainer lost after step " << at_kill << ", the run went back to step " << back_to << "; accuracy "
                                     << s["accuracy_before"].get<double>() << " -> "
                                     << s["accuracy_after"].get<double>() << ", " << s["trained"] << " trained, "
                                     << s["dropped"] << " dropped");
  CHECK(s["steps"] == steps);
  CHECK(s["admitted"].get<int64_t>() == s["trained"].get<int64_t>() + s["dropped"].get<int64_t>());
  CHECK(s["max_staleness"].get<int64_t>() <= 2);
  CHECK_MESSAGE(s["accuracy_after"].get<double>() > s["accuracy_before"].get<double>(), s.dump());
}
