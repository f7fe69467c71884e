// The kernels' settings a run's configuration gives: the engine each rollout
// worker runs, the sampling of its requests, and the trainer's step. The job
// builds its actors from these; benchmarks measure the same engine and trainer
// alone (bench_async_vs_sync's capacities), so that what they time is what the
// job runs.
#pragma once

#include <cstdint>

#include "areal/kernels/engine.hpp"
#include "areal/kernels/model_config.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/messages/records.hpp"
#include "areal/runtime/config.hpp"

namespace areal {

/// The longest sequence (prompt and response) a run handles with this model.
int64_t max_sequence(const kernels::model_config& model);

/// A rollout worker's engine: rl.rollout_slots, the model's context, rl.interruption, rl.prompt_pool_tokens.
kernels::engine_config rollout_engine_config(const run_config& c, const kernels::model_config& model);

/// The sampling of every RL request: rl.temperature, top_k, top_p, max_new_tokens, stopping at `eos`.
sampling_params rollout_sampling(const run_config& c, int32_t eos);

/// The trainer's PPO step: optimizer, objective ([rl]'s clip, caps, KL), minibatches, micro-batch tokens.
/// data_parallel is left at 1: the job sets the replicas from the node's cores.
kernels::trainer_config rl_trainer_config(const run_config& c);

}  // namespace areal
