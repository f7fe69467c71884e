// The kernels' settings a run's configuration gives (run_kernels.hpp).
#include "areal/actors/run_kernels.hpp"

#include <algorithm>

#include "job_parts.hpp"

namespace areal {

int64_t max_sequence(const kernels::model_config& model) {
  return std::min<int64_t>(model.max_position_embeddings, 1024);
}

kernels::engine_config rollout_engine_config(const run_config& c, const kernels::model_config& model) {
  kernels::engine_config e{c.rl.rollout_slots, max_sequence(model), 512,
                           kernels::parse_interruption(c.rl.interruption)};
  e.prompt_pool_tokens = c.rl.prompt_pool_tokens;
  return e;
}

sampling_params rollout_sampling(const run_config& c, int32_t eos) {
  sampling_params s;
  s.temperature = static_cast<float>(c.rl.temperature);
  s.top_k = c.rl.top_k;
  s.top_p = static_cast<float>(c.rl.top_p);
  s.max_new_tokens = static_cast<uint32_t>(c.rl.max_new_tokens);
  s.stop_tokens = {eos};
  return s;
}

kernels::trainer_config rl_trainer_config(const run_config& c) {
  auto& rl = c.rl;
  kernels::trainer_config t;
  t.optimizer.lr = rl.lr;
  t.optimizer.warmup_steps = rl.warmup_steps;
  t.optimizer.total_steps = rl.steps;
  t.ppo.clip_low = rl.clip;
  t.ppo.clip_high = rl.clip;
  t.ppo.behaviour_cap = rl.behaviour_cap;
  t.ppo.cap_clamps = rl.behaviour_clamp;
  t.ppo.dual_clip = rl.dual_clip;
  t.ppo.decoupled = rl.decoupled;
  t.kl_coef = rl.kl_coef;
  t.kl = kernels::parse_kl_estimator(rl.kl_estimator);
  t.ppo_minibatches = rl.ppo_minibatches;
  t.max_tokens_per_mb = rl.max_tokens_per_mb;
  t.temperature = rl.temperature;
  t.seed = job::stream_seed(c.run.seed, 6);
  return t;
}

}  // namespace areal
