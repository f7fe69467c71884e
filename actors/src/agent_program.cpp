// The agent program of an agent run (see agent_program.hpp).
#include "agent_program.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "endpoint_openai.hpp"
#include "job_parts.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace areal::job {

namespace {

std::vector<std::string> split_command(const std::string& command) {
  std::vector<std::string> words;
  std::istringstream in{command};
  for (std::string w; in >> w;)
    words.push_back(w);
  return words;
}

// A bare name is looked for beside the areal binary first (the built-in
// agents are built there), then on PATH.
std::string resolve(const std::string& program) {
  if (program.find('/') != std::string::npos)
    return program;
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto beside = self.parent_path() / program;
    if (::access(beside.c_str(), X_OK) == 0)
      return beside.string();
  }
  return program;
}

}  // namespace

agent_program::agent_program(const run_config& c, const std::map<std::string, std::string>& env,
                             const fs::path& stdout_path) {
  auto words = split_command(c.agent.command);
  if (words.empty())
    throw job_error("agent.command is empty; name the agent program to run");
  words[0] = resolve(words[0]);
  std::vector<char*> argv;
  for (auto& w : words)
    argv.push_back(w.data());
  argv.push_back(nullptr);
  // areal's environment, with the agent's variables replacing any of the same name.
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string v{*e};
    auto name = v.substr(0, v.find('='));
    if (!env.count(name))
      vars.push_back(std::move(v));
  }
  for (auto& [name, value] : env)
    vars.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& v : vars)
    envp.push_back(v.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!stdout_path.empty())
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  int rc = posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw job_error("agent.command = \"" + c.agent.command + "\": cannot start " + words[0] + " (" +
                    std::strerror(rc) + "); give the path of an executable agent program");
}

agent_program::~agent_program() {
  if (!status_)
    stop();
}

std::optional<int> agent_program::wait(std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!status_) {
    int status = 0;
    auto r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      exited_at_ = std::chrono::steady_clock::now();
      break;
    }
    if (r < 0 && errno != EINTR) {
      status_ = 127;
      exited_at_ = std::chrono::steady_clock::now();
      break;
    }
    if (std::chrono::steady_clock::now() >= until)
      return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status_;
}

int agent_program::stop(std::chrono::milliseconds grace) {
  if (status_)
    return *status_;
  ::kill(pid_, SIGTERM);
  if (auto s = wait(grace))
    return *s;
  ::kill(pid_, SIGKILL);
  return wait(std::chrono::seconds(10)).value_or(137);
}

std::map<std::string, std::string> agent_environment(const run_config& c, uint16_t port, const std::string& api_key,
                                                     const std::string& mode) {
  auto base = "http://127.0.0.1:" + std::to_string(port);
  return {{"AREAL_AGENT_MODE", mode},
          {"AREAL_BASE_URL", base},
          {"OPENAI_BASE_URL", base + "/v1"},
          {"OPENAI_API_KEY", api_key.empty() ? "none" : api_key},
          {"AREAL_MODEL", c.endpoint.model_name},
          {"AREAL_SEED", std::to_string(c.run.seed)},
          {"AREAL_GROUP_SIZE", std::to_string(c.rl.group_size)},
          {"AREAL_DEMOS", std::to_string(c.agent.demos)},
          {"AREAL_EVAL_EPISODES", std::to_string(c.agent.eval_episodes)}};
}

std::vector<kernels::sft_sample> agent_demonstrations(const run_config& c, const kernels::chat_template& chat,
                                                      int64_t max_tokens, const fs::path& run_dir) {
  auto path = run_dir / "agent_demos.jsonl";
  spdlog::info("warm start: asking the agent program for {} demonstrations ({})", c.agent.demos, c.agent.command);
  {
    agent_program demos{c, agent_environment(c, 0, {}, "demos"), path};
    auto wait = std::chrono::milliseconds(static_cast<int64_t>(c.agent.wait_s * 1000));
    auto status = demos.wait(wait);
    if (!status)
      throw job_error("the agent program did not write its demonstrations within agent.wait_s = " +
                      std::to_string(static_cast<int64_t>(c.agent.wait_s)) + " s; it was stopped");
    if (*status != 0)
      throw job_error("the agent program (mode demos) exited with status " + std::to_string(*status) +
                      "; its output is in " + path.string());
  }
  std::ifstream in{path};
  std::vector<kernels::sft_sample> out;
  int64_t line_no = 0, too_long = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    auto where = path.string() + ":" + std::to_string(line_no);
    kernels::chat_template::transcript t;
    try {
      auto request = openai::parse_chat(line);
      if (request.messages.empty() || request.messages.back().role != "assistant")
        throw job_error(where + ": a demonstration ends with the assistant's turn");
      t = chat.render_transcript(request.messages, request.tools);
    } catch (const openai::api_error& e) {
      throw job_error(where + ": not a chat transcript: " + e.message);
    } catch (const kernels::template_error& e) {
      throw job_error(where + ": " + e.what());
    }
    if (static_cast<int64_t>(t.tokens.size()) > max_tokens) {
      too_long++;
      continue;
    }
    auto first = std::find(t.mask.begin(), t.mask.end(), uint8_t{1}) - t.mask.begin();
    kernels::sft_sample s;
    s.prompt.assign(t.tokens.begin(), t.tokens.begin() + first);
    s.response.assign(t.tokens.begin() + first, t.tokens.end());
    s.loss_mask.assign(t.mask.begin() + first, t.mask.end());
    out.push_back(std::move(s));
  }
  if (out.empty())
    throw job_error(path.string() + ": the agent program wrote no usable demonstration (" + std::to_string(too_long) +
                    " longer than the context); check its demos mode");
  spdlog::info("warm start: {} chat demonstrations{}", out.size(),
               too_long ? ", " + std::to_string(too_long) + " skipped (longer than the context)" : std::string{});
  return out;
}

std::optional<double> agent_evaluation(const run_config& c, const http_endpoint& endpoint, const std::string& api_key,
                                       const std::atomic<bool>& stop, const std::string& when) {
  auto before = endpoint.counts().episodes;
  auto start = std::chrono::steady_clock::now();
  agent_program eval{c, agent_environment(c, endpoint.port(), api_key, "eval")};
  auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(c.agent.wait_s * 1000));
  std::optional<int> status;
  while (!status) {
    if (stop.load()) {
      eval.stop();
      return std::nullopt;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      eval.stop();
      throw job_error("the agent program did not finish its held-out episodes " + when + " RL within agent.wait_s = " +
                      std::to_string(static_cast<int64_t>(c.agent.wait_s)) + " s; it was stopped");
    }
    status = eval.wait(std::chrono::milliseconds(200));
  }
  if (*status != 0)
    throw job_error("the agent program (mode eval, " + when + " RL) exited with status " + std::to_string(*status));
  auto after = endpoint.counts().episodes;
  auto ended = after.eval_ended - before.eval_ended;
  auto dropped = after.eval_dropped - before.eval_dropped;
  if (ended + dropped == 0)
    throw job_error("the agent program (mode eval) ran no held-out episode (POST /rl/episodes with \"eval\": true)");
  double mean = (after.eval_reward_sum - before.eval_reward_sum) / static_cast<double>(ended + dropped);
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("held-out episodes {} RL: mean reward {:.3f} ({} episodes, {} dropped, {:.0f} s)", when, mean,
               ended + dropped, dropped, seconds);
  return mean;
}

}  // namespace areal::job
