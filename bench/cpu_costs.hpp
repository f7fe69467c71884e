// This machine's costs for the simulator (the "measured here" cost model):
// the real engine's decode steps and prefills and the real trainer's PPO
// steps, timed on a warm-started model and fitted linearly (fitted_costs).
// Each is measured twice, as the job's compute_share runs them: alone (the
// engine on every thread, the trainer's replicas on every core), and while
// the other side computes at the same time (the engine on its split share,
// the trainer's replicas beside it), since on one node both share the cores.
#pragma once

#include <filesystem>

#include "areal/sim/cost_model.hpp"
#include "bench_jobs.hpp"

namespace areal::bench {

struct cpu_rates {
  sim::measured_rates alone, shared;
};

/// Measures the rates on the model in `model_dir` (a run's sft_model) with
/// the workload's prompts and response cap, on `threads` compute threads.
cpu_rates measure_cpu_rates(const std::filesystem::path& model_dir, const workload& w, int threads, bool quick);

}  // namespace areal::bench
