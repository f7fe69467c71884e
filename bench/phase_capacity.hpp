// The two phases' capacities as the job runs them (bench_async_vs_sync's bound):
// generation G (response tokens/s of the job's engine with a full continuous
// batch) and training T (trained tokens/s of trainer::ppo_update, one
// data-parallel replica per thread), alone at a thread count or both at once.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "bench_jobs.hpp"

#include "areal/kernels/engine.hpp"

namespace areal::bench {

struct capacity {
  double generation = 0;  // response tokens/s, full continuous batch
  double training = 0;    // trained tokens/s, PPO update including the proximal pass
};

/// G and T alone at `threads` intra-op threads; `outputs` gets the trajectories
/// the generation produced (for the training batches).
capacity measure_capacity(const std::filesystem::path& model_dir, const workload& w, int threads, bool quick,
                          std::vector<kernels::generation_output>& outputs);

/// G and T measured at once, as the job runs both phases together: generation
/// on a thread of its own with `generation_threads` intra-op threads (its batch
/// kept full), training with `replicas` replicas, over the same updates.
capacity measure_together(const std::filesystem::path& model_dir, const workload& w, int generation_threads,
                          int replicas, bool quick, const std::vector<kernels::generation_output>& outputs);

/// One configuration of the phases on the node's cores and what each phase
/// does per second in it.
struct configuration {
  std::string name;
  double generation = 0, training = 0;
};

/// The best mix in time of `configs` that trains no more than it generates
/// (at most two of them are needed); `how` gets the mix.
double best_mix(const std::vector<configuration>& configs, std::string& how);

/// The bound on trained tokens/s over the configurations the job runs on
/// `threads` cores, measured: each phase alone at each thread count (caps),
/// both at once on shared cores (the trainer keeps every thread, the engine
/// takes threads / 2) and on a static split (k and threads - k), and the best
/// mix of them; beside it, the mix were phases on split cores as fast as alone,
/// and the synchronous ideal (both phases alternating on every thread).
struct bound_measurement {
  std::vector<capacity> caps;  // by thread count, 1 .. threads
  std::vector<configuration> configurations;
  double bound = 0, assumed_bound = 0, alternating = 0;
  std::string bound_how, assumed_how;
};
/// `log`, when given, gets a line per measurement.
bound_measurement measure_bound(const std::filesystem::path& model_dir, const workload& w, int threads, bool quick,
                                std::vector<kernels::generation_output>& outputs, std::ostream* log);

/// The capacities and bounds of a and b averaged: what was measured before and
/// after a stretch of runs, for the runs between (the machine's speed drifts).
bound_measurement bracket(const bound_measurement& a, const bound_measurement& b);

}  // namespace areal::bench
