// An agent RL run end to end in one process: a client opens episodes through
// the endpoint, runs two turns each (with a tool declared), rewards and ends
// them; the run trains on them. The trained trajectories (rl.record_trajectories)
// hold exactly the token ids and versions the client received, with loss mask 1
// on them and 0 on everything else; the staleness bound holds per episode; an
// episode never ended is dropped at its deadline and the others are still trained.
#include <caf/all.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "areal/actors/rl_job.hpp"
#include "areal/runtime/config.hpp"
#include "torch_doctest.hpp"

using namespace areal;
using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// What the client saw of one episode.
struct seen_episode {
  std::vector<int32_t> generated;  // token ids of every reply, in order
  std::vector<int64_t> versions;
  int turns = 0;
};

const char* add_tool =
    R"({"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}})";

}  // namespace

TEST_CASE("Agent episodes through the endpoint are trained with the exact tokens, masks and versions the client saw") {
  auto dir = fs::temp_directory_path() / ("areal-agent-run-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto port = free_port();
  auto text = "[run]\nname = \"agent\"\nseed = 2\n[model]\npreset = \"micro\"\n[task]\nkind = \"agent\"\n"
              "[sft]\nsteps = 0\n[eval]\nprompts = 0\n"
              "[rl]\nsteps = 3\neta = 1\ngroup_size = 2\nbatch_size = 4\nmax_new_tokens = 6\n"
              "record_trajectories = true\ncheckpoint_every = 0\n"
              "[endpoint]\nepisode_timeout_s = 2\n"
              "[[nodes]]\nname = \"local\"\nroles = [\"controller\", \"trainer\", \"rollout\", \"reward\"]\n"
              "compute_threads = 2\nhttp_port = " +
              std::to_string(port) + "\n";
  auto parsed = parse_config(text, "agent.toml");
  REQUIRE_MESSAGE(parsed.config, (parsed.errors.empty() ? "" : parsed.errors.front()));
  rl_job_options o;
  o.config = *parsed.config;
  o.self = o.config.nodes[0];
  o.run_dir = dir;
  o.compute_threads = 2;
  o.progress = false;

  std::map<std::pair<uint64_t, uint32_t>, seen_episode> seen;
  std::atomic<int> dropped_seen{0};
  std::thread agent;
  o.on_started = [&](const rl_job_actors& actors) {
    REQUIRE(actors.endpoint_port == port);
    agent = std::thread([&] {
      httplib::Client c{"127.0.0.1", port};
      c.set_read_timeout(30, 0);
      auto post = [&](const std::string& path, const json& body, const std::string& episode = {}) {
        httplib::Headers h;
        if (!episode.empty())
          h.emplace("X-Episode-Id", episode);
        return c.Post(path, h, body.dump(), "application/json");
      };
      // One episode that is never ended: dropped at its deadline.
      if (auto r = post("/rl/episodes", {{"task", "abandoned"}}); r && r->status == 200) {
        auto id = json::parse(r->body)["id"].get<std::string>();
        post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 3}}, id);
      }
      for (int task = 0; task < 200; ++task) {
        for (int member = 0; member < 2; ++member) {
          auto opened = post("/rl/episodes", {{"task", "t" + std::to_string(task)}});
          for (int attempt = 0; attempt < 400 && opened && opened->status == 429; ++attempt) {
            std::this_thread::sleep_for(20ms);  // the gate is closed: the trainer catches up
            opened = post("/rl/episodes", {{"task", "t" + std::to_string(task)}});
          }
          if (!opened || opened->status != 200)
            return;  // the run ended
          auto e = json::parse(opened->body);
          auto id = e["id"].get<std::string>();
          auto& record = seen[{e["group"].get<uint64_t>(), e["index"].get<uint32_t>()}];
          json messages = {{{"role", "system"}, {"content", "add"}}, {{"role", "user"}, {"content", "1+2"}}};
          for (int turn = 0; turn < 2; ++turn) {
            auto r = post("/v1/chat/completions",
                          {{"model", "areal"}, {"messages", messages}, {"tools", {json::parse(add_tool)}},
                           {"max_tokens", 5}, {"temperature", 1.0}},
                          id);
            if (!r || r->status != 200)
              return;
            auto body = json::parse(r->body);
            auto& choice = body["choices"][0];
            for (auto t : choice["token_ids"])
              record.generated.push_back(t.get<int32_t>());
            for (auto v : choice["token_versions"])
              record.versions.push_back(v.get<int64_t>());
            record.turns++;
            messages.push_back(choice["message"]);  // sent back as received
            if (choice["message"].contains("tool_calls"))
              for (auto& call : choice["message"]["tool_calls"])
                messages.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "3"}});
            else
              messages.push_back({{"role", "user"}, {"content", "again"}});
          }
          auto end = post("/rl/episodes/" + id + "/end", {{"reward", (task + member) % 2}});
          if (!end || end->status != 200)
            return;
        }
      }
    });
  };
  std::atomic<bool> stop{false};
  auto result = run_rl_job(o, stop);
  agent.join();
  REQUIRE_MESSAGE(result.exit_code == 0, result.why);
  CHECK(result.stats.steps == 3);
  CHECK(result.stats.trained == 12);
  CHECK(result.stats.admitted == result.stats.trained + result.stats.dropped);
  CHECK(result.stats.dropped >= 1);  // the abandoned episode, at least

  std::ifstream in(dir / "trajectories.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    auto t = json::parse(line);
    ++lines;
    auto key = std::make_pair(t["group"].get<uint64_t>(), t["index"].get<uint32_t>());
    REQUIRE(seen.count(key));
    auto& client = seen[key];
    auto output = t["output_tokens"].get<std::vector<int32_t>>();
    auto mask = t["loss_mask"].get<std::vector<uint8_t>>();
    auto versions = t["token_versions"].get<std::vector<int64_t>>();
    REQUIRE(mask.size() == output.size());
    std::vector<int32_t> generated;
    std::vector<int64_t> generated_versions;
    for (size_t i = 0; i < output.size(); ++i)
      if (mask[i]) {
        generated.push_back(output[i]);
        generated_versions.push_back(versions[i]);
      }
    // Token in, token out: exactly the ids the client received, with their versions.
    CHECK(generated == client.generated);
    CHECK(generated_versions == client.versions);
    CHECK(client.turns == 2);
    // Between the two turns lie tokens the model did not generate (the tool result or the user turn).
    CHECK(std::count(mask.begin(), mask.end(), 0) > 0);
    // The staleness bound holds per episode: batch b trains version b on tokens of version >= b - eta.
    auto batch = t["batch"].get<int64_t>();
    CHECK(batch - *std::min_element(versions.begin(), versions.end()) <= 1);
  }
  CHECK(lines == 12);
  fs::remove_all(dir);
}
