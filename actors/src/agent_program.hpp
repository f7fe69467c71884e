// The agent program of an agent run (agent.command): a separate process that
// talks to the endpoint over HTTP only, exactly as any external agent would.
// areal starts it in one of three modes, told by its environment:
//   AREAL_AGENT_MODE=demos  write AREAL_DEMOS chat transcripts (one chat request
//                           body per line, ending with the assistant's answer) to stdout
//   AREAL_AGENT_MODE=eval   run AREAL_EVAL_EPISODES held-out episodes greedily
//                           (POST /rl/episodes {"task": ..., "eval": true})
//   AREAL_AGENT_MODE=train  run training episodes until the endpoint refuses new
//                           ones with 503 (the run ended), in groups of AREAL_GROUP_SIZE per task
// and always OPENAI_BASE_URL (…/v1), AREAL_BASE_URL, OPENAI_API_KEY, AREAL_MODEL, AREAL_SEED.
// Internal to actors/.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "areal/actors/endpoint.hpp"
#include "areal/kernels/chat_template.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/config.hpp"

namespace areal::job {

/// One running agent process; stopped (SIGTERM, then SIGKILL) when destroyed.
class agent_program {
 public:
  /// Starts agent.command with these variables added to areal's environment,
  /// its stdout into `stdout_path` (empty: areal's). Throws job_error.
  agent_program(const run_config& c, const std::map<std::string, std::string>& env,
                const std::filesystem::path& stdout_path = {});
  ~agent_program();
  agent_program(const agent_program&) = delete;
  agent_program& operator=(const agent_program&) = delete;

  /// Its exit status once it exited within `timeout` (128 + N for signal N), else nullopt.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  /// Stops it: SIGTERM, SIGKILL after `grace`. Returns its status.
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  /// When wait() first saw it exited.
  std::optional<std::chrono::steady_clock::time_point> exited_at() const { return exited_at_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::optional<std::chrono::steady_clock::time_point> exited_at_;
};

/// The variables every mode gets: the endpoint's address, key, model and the run's seed.
std::map<std::string, std::string> agent_environment(const run_config& c, uint16_t port, const std::string& api_key,
                                                     const std::string& mode);

/// The warm start's demonstrations: runs the agent in demos mode (no endpoint
/// needed), keeps its transcripts in `run_dir`/agent_demos.jsonl and renders
/// each into tokens with a loss mask on the assistant turns. Transcripts longer
/// than `max_tokens` are skipped and counted. Throws job_error naming the line.
std::vector<kernels::sft_sample> agent_demonstrations(const run_config& c, const kernels::chat_template& chat,
                                                      int64_t max_tokens, const std::filesystem::path& run_dir);

/// The agent's held-out episodes (mode eval, greedy) through `endpoint`: the
/// mean reward of the agent.eval_episodes it ran (a dropped one counts 0), or
/// nullopt when `stop` was set meanwhile. Throws job_error: the agent failed,
/// ran no episode, or did not finish within agent.wait_s.
std::optional<double> agent_evaluation(const run_config& c, const http_endpoint& endpoint, const std::string& api_key,
                                       const std::atomic<bool>& stop, const std::string& when);

}  // namespace areal::job
