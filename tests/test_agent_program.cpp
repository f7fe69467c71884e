// The agent program of an agent run, as a user runs it: `areal --config
// configs/agent_calculator.toml` (CI-sized) starts areal-calculator-agent,
// which writes the warm start's chat transcripts, runs the held-out episodes
// before and after RL and the training episodes, all over HTTP. And an agent
// program that fails ends the run with the reason.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "node_process.hpp"

using namespace areal::test;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> ci_sized_agent_run(const std::vector<std::string>& more = {}) {
  std::vector<std::string> args{"--config", AREAL_SOURCE_DIR "/configs/agent_calculator.toml",
                                "--set",    "model.preset=micro",
                                "--set",    "sft.steps=10",
                                "--set",    "agent.demos=40",
                                "--set",    "agent.eval_episodes=6",
                                "--set",    "rl.steps=2",
                                "--set",    "rl.group_size=4",
                                "--set",    "rl.batch_size=8",
                                "--set",    "rl.max_new_tokens=48",
                                "--set",    "nodes.local.http_port=" + std::to_string(free_port())};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace

TEST_CASE("An agent run: the agent program writes the demonstrations, measures before and after RL and trains") {
  scratch_dir dir{"agent-program"};
  node_process run(ci_sized_agent_run(), dir.path / "run.log", dir.path);
  REQUIRE(run.started());
  auto code = run.wait_exit(240s);
  auto log = run.log();
  INFO(log);
  REQUIRE(code);
  CHECK(*code == 0);
  auto run_dir = dir.path / "runs" / "agent-calculator";
  // The transcripts it wrote, each a chat request ending with the assistant's answer, trained on.
  auto demos = read_text(run_dir / "agent_demos.jsonl");
  CHECK(std::count(demos.begin(), demos.end(), '\n') == 40);
  CHECK(log.find("warm start: 40 chat demonstrations") != std::string::npos);
  CHECK(log.find("held-out episodes before RL: mean reward") != std::string::npos);
  CHECK(log.find("held-out episodes after RL: mean reward") != std::string::npos);
  CHECK(log.find("training episodes, the run ended") != std::string::npos);
  auto summary = nlohmann::json::parse(read_text(run_dir / "summary.json"));
  CHECK(summary["accuracy_before"].get<double>() >= 0);
  CHECK(summary["accuracy_after"].get<double>() >= 0);
  CHECK(summary["trained"].get<int64_t>() == 16);
  CHECK(summary["steps"].get<int64_t>() == 2);
  // The endpoint's record: the episodes it ended (at least the trained ones), none split, the held-out ones.
  CHECK(summary["endpoint"]["episodes_ended"].get<int64_t>() >= 16);
  CHECK(summary["endpoint"]["episode_splits"].get<int64_t>() == 0);
  CHECK(summary["endpoint"]["held_out_episodes"].get<int64_t>() == 12);
}

TEST_CASE("An agent program that cannot start or fails ends the run with the reason") {
  scratch_dir dir{"agent-program-fails"};
  SUBCASE("not there: refused before any work") {
    node_process run(ci_sized_agent_run({"--set", "agent.command=/nonexistent/agent"}), dir.path / "a.log", dir.path);
    auto code = run.wait_exit(120s);
    INFO(run.log());
    REQUIRE(code);
    CHECK(*code == 2);
    CHECK(run.log().find("cannot start /nonexistent/agent") != std::string::npos);
  }
  SUBCASE("its training episodes stop: the run ends instead of waiting for episodes forever") {
    node_process run(ci_sized_agent_run({"--set", "agent.command=\"false\"", "--set", "sft.steps=0", "--set",
                                         "agent.eval_episodes=0"}),
                     dir.path / "b.log", dir.path);
    auto code = run.wait_exit(120s);
    INFO(run.log());
    REQUIRE(code);
    CHECK(*code == 1);
    CHECK(run.log().find("the agent program (mode train) exited with status 1 before the run ended") !=
          std::string::npos);
  }
}
