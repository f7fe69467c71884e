// The trainer actor's behaviour: group advantages, one decoupled-PPO update per
// batch, and a snapshot of the new weights for the rollout workers.
#include "areal/actors/trainer_actor.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <map>

#include <caf/all.hpp>

namespace areal {

namespace {

struct trainer_state {
  static inline const char* name = "areal.trainer";
  trainer_setup setup;
  std::unique_ptr<kernels::trainer> trainer;
  std::shared_ptr<const at::Tensor> snapshot;  // weights of the current version, never modified
};

using trainer_pointer = trainer_actor::stateful_pointer<trainer_state>;

local_weights current_weights(trainer_pointer self) {
  auto& st = self->state;
  if (!st.snapshot)
    st.snapshot = std::make_shared<const at::Tensor>(st.setup.model->flat().detach().clone());
  return {st.trainer->policy_version(), st.snapshot};
}

}  // namespace

trainer_actor spawn_trainer(caf::actor_system& sys, trainer_setup setup) {
  return sys.spawn<caf::detached>(
      [setup = std::move(setup)](trainer_pointer self) mutable -> trainer_actor::behavior_type {
        self->state.setup = std::move(setup);
        auto& config = self->state.setup;
        self->state.trainer = std::make_unique<kernels::trainer>(*config.model, config.config);
        self->state.trainer->set_policy_version(config.initial_version);
        return {
            [self](train_atom, std::vector<packed<trajectory>>& batch) -> caf::result<train_report, local_weights> {
              auto& st = self->state;
              at::set_num_threads(st.setup.compute_threads);
              std::vector<trajectory> trajectories;
              for (auto& p : batch) {
                auto t = unpack(p);
                if (!t)
                  return std::move(t.error());
                trajectories.push_back(std::move(*t));
              }
              // Advantages per group (the samples of one prompt), from shaped rewards.
              std::map<uint64_t, std::vector<size_t>> groups;
              for (size_t i = 0; i < trajectories.size(); ++i)
                groups[trajectories[i].group_id].push_back(i);
              std::vector<kernels::rl_sample> samples(trajectories.size());
              train_report report;
              int64_t oldest = st.trainer->policy_version();
              for (auto& [group, members] : groups) {
                std::vector<double> rewards;
                for (auto i : members) {
                  auto& t = trajectories[i];
                  rewards.push_back(
                      kernels::shape_reward(t.reward, static_cast<int64_t>(t.output_tokens.size()), st.setup.shaping));
                  report.reward_mean += t.reward;
                }
                auto advantages = kernels::group_advantages(rewards, st.setup.estimator);
                for (size_t k = 0; k < members.size(); ++k) {
                  auto& t = trajectories[members[k]];
                  auto& sample = samples[members[k]];
                  sample.prompt = t.prompt_tokens;
                  sample.response = t.output_tokens;
                  sample.behaviour_logprobs = t.behaviour_logprobs;
                  sample.advantage = advantages[k];
                  for (auto v : t.token_versions)
                    oldest = std::min(oldest, v);
                }
              }
              // Empty responses carry no tokens to train on.
              samples.erase(std::remove_if(samples.begin(), samples.end(), [](auto& x) { return x.response.empty(); }),
                            samples.end());
              kernels::step_stats stats;
              try {
                stats = st.trainer->ppo_update(samples);
              } catch (const std::exception& e) {
                return caf::make_error(caf::sec::runtime_error, std::string{"trainer: "} + e.what());
              }
              st.trainer->set_policy_version(st.trainer->policy_version() + 1);
              st.snapshot.reset();
              report.version = st.trainer->policy_version();
              report.loss = stats.loss;
              report.grad_norm = stats.grad_norm;
              report.reward_mean /= std::max<size_t>(1, trajectories.size());
              report.samples = static_cast<int64_t>(trajectories.size());
              report.tokens = stats.tokens;
              report.behaviour_masked = stats.ppo.behaviour_masked;
              report.max_staleness = report.version - 1 - oldest;
              report.seconds = stats.seconds;
              return caf::result<train_report, local_weights>(report, current_weights(self));
            },
            [self](weights_atom) { return current_weights(self); },
        };
      });
}

}  // namespace areal
