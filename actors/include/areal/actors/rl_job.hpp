// A whole RL run on one node: the supervised warm start, held-out evaluation
// before, the pipeline of actors (controller, rollout workers, reward pool,
// trainer, evaluator) in asynchronous or synchronous mode, evaluation after,
// and the run directory's outputs:
//   config.toml          the resolved configuration (written by the caller)
//   metrics.jsonl        one JSON line per step, evaluation, resume and end
//   trace.json           Chrome-trace timeline of every actor (open in Perfetto)
//   checkpoint/          the latest run checkpoint (trainer + controller state)
//   sft_model/           the warm-started model (Hugging Face layout; usable as model.path)
//   summary.json         accuracy before and after, counters, timings
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"
#include "areal/runtime/config.hpp"
#include "areal/runtime/trace.hpp"

namespace areal {

/// The actors of a running job (for an embedding application, and the tests).
struct rl_job_actors {
  controller_actor controller;
  trainer_actor trainer;
  sample_store_actor store;  // beside the trainer
  reward_pool_actor reward;  // unset when no reward role runs here
  std::vector<rollout_actor> rollouts;
  evaluator_actor evaluator;         // unset without periodic evaluation
  weight_publisher_actor publisher;  // multi-node runs only
  uint16_t endpoint_port = 0;        // the OpenAI-compatible endpoint's port (0: none on this node)
};

struct rl_job_options {
  run_config config;
  std::filesystem::path run_dir;
  bool resume = false;      // continue from run_dir/checkpoint
  int compute_threads = 1;  // the node's cores for LibTorch work
  bool share_cores = true;  // work-conserving sharing between generation and training; false: static split
  bool progress = true;     // the live progress line on stderr
  /// Multi-node runs: this process's node actor (the controller node's) and
  /// its roles. The job runs the members its roles name (rollout workers,
  /// reward pool) and takes the other nodes' members as they join; weights go
  /// out through a weight publisher. Unset: one process runs everything.
  node_actor node;
  node_spec self;
  /// Called once the pipeline runs, from the job's thread. Every actor of
  /// the job is watched: one that stops ends the run with its reason (exit 1).
  std::function<void(const rl_job_actors&)> on_started;
};

struct rl_job_result {
  int exit_code = 0;
  std::string why;
  double accuracy_before = -1;  // held-out greedy accuracy when RL started (-1: not evaluated)
  double accuracy_after = -1;   // and when it ended
  controller_stats stats;
  reward_pool_stats reward;
  double sft_seconds = 0;
  double rl_seconds = 0;
  /// CPU time (user and system, every thread of the process) over the RL
  /// phase: beside rl_seconds and the cores, how busy they were.
  double rl_cpu_seconds = 0;
};

/// Runs the job in `sys`; blocks until it ends. Setting `stop` (SIGINT) stops
/// the run at the next step boundary with a checkpoint written.
rl_job_result run_rl_job(caf::actor_system& sys, const rl_job_options& options, const std::atomic<bool>& stop);
/// The same in an actor system of its own (configured from options.config.cluster).
rl_job_result run_rl_job(const rl_job_options& options, const std::atomic<bool>& stop);

/// A node other than the controller's, in an RL run: spawns the members its
/// roles name (rollout workers with a weight subscriber, a reward pool) and
/// has them join the run through the controller node's node actor, the
/// rollout workers once they hold the current weights. Linked to its members.
node_members_actor spawn_node_members(caf::actor_system& sys, const run_config& config, const node_spec& self,
                                      node_actor controller_node, std::shared_ptr<tracer> trace);

}  // namespace areal
