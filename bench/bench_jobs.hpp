// The real RL job as the benchmarks run it: a workload of the running-sums
// task on a preset model, its configuration, and one run in this process.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "areal/actors/rl_job.hpp"
#include "areal/runtime/config.hpp"

namespace areal::bench {

struct workload {
  std::string name;
  std::string preset;
  int64_t max_value, max_terms;
  double median_terms, truncated_fraction;
  int64_t max_new_tokens, sft_steps, rl_steps, batch_size, group_size, eval_prompts;
  std::vector<std::string> extra;  // further --set overrides of every run
};

/// The demo's workload (configs/single_node.toml): the tiny preset on running
/// sums (median 3 terms, up to 8), 60% of the demonstrations cut short, 32 new
/// tokens, 64 samples per step in groups of 8.
workload demo_workload(int64_t sft_steps, int64_t rl_steps, int64_t eval_prompts, std::vector<std::string> extra = {});

/// The workload's configuration (one node with every role on `threads`
/// compute threads, no checkpoints, evaluation before and after only), with
/// the workload's and then these overrides applied; exits on an invalid one.
run_config make_config(const workload& w, int threads, std::vector<std::string> overrides);

/// The workload as configs/four_nodes.toml's topology on loopback, as TOML: the
/// head (controller and trainer), a scorer and two generation nodes, one compute
/// thread each, Gloo weights, no TLS, on `ports` (four). The workload's `extra`
/// overrides are not in it: pass them with --set.
std::string four_process_config(const workload& w, const std::vector<uint16_t>& ports);

/// One run of the job in this process, writing into `dir`; `share`: the
/// rollout and trainer sides share the cores (false: a static split).
rl_job_result run_job(const run_config& config, const std::filesystem::path& dir, int threads, bool share);

/// Where a run's time went, from its trace.json: the trainer's steps and the
/// rollout engines' steps, and how long they ran at once.
struct time_use {
  double train_s = 0;                  // the trainer's steps (trainer::ppo_update, and the reference pass with KL on)
  double generate_s = 0;               // engine steps, every rollout worker's
  double generate_beside_train_s = 0;  // engine steps while the trainer was in a step
  int64_t engine_steps = 0;
  int64_t decode_rows = 0;  // sequences decoded, summed over the engine steps
  // CPU seconds of the threads that recorded the spans ("cpu_us"): the
  // trainer's first replica, and the rollout workers' own threads.
  double train_cpu_s = 0, generate_cpu_s = 0;
  // The trainer's replicas waiting for one another at its passes' ends, summed
  // over replicas ("replicas_waited_us"; 0 with one replica).
  double train_replicas_waited_s = 0;
};

/// Reads `trace_file` (a run's trace.json); throws std::runtime_error when it
/// cannot be read or holds no step of the trainer.
time_use read_time_use(const std::filesystem::path& trace_file);

}  // namespace areal::bench
