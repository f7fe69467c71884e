// The two phases' capacities as the job runs them (bench_async_vs_sync's bound):
// generation G (response tokens/s of the job's engine with a full continuous
// batch) and training T (trained tokens/s of trainer::ppo_update, one
// data-parallel replica per thread), alone at a thread count or both at once.
#pragma once

#include <filesystem>
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

}  // namespace areal::bench
