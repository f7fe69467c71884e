// The trainer actor with the sample store and a rollout worker: scored groups
// into the store, a batch named by slots, a PPO step, a new version out; the
// trainer sends its weights to the rollout worker and what was rewarded
// becomes more likely.
#include <caf/all.hpp>

#include "areal/actors/node.hpp"
#include "areal/actors/rollout.hpp"
#include "areal/actors/sample_store.hpp"
#include "areal/actors/trainer_actor.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal;
using namespace areal::kernels;
using namespace std::chrono_literals;

namespace {

model_config small() {
  return test::small_model_config(16, 64);
}

// Probability of `token` right after `prompt` under the weights `flat`.
double first_token_probability(const at::Tensor& flat, const std::vector<int32_t>& prompt, int64_t token) {
  policy_model m(small());
  m.flat().copy_(flat);
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  auto n = static_cast<int64_t>(tokens.size());
  auto logits = m.logits(m.forward(at::tensor(tokens), {0, n}));
  return at::softmax(logits[n - 1], -1)[token].item<double>();
}

}  // namespace

TEST_CASE("rewarded first tokens become more likely after trainer steps, and versions advance") {
  caf::actor_system_config cfg;
  configure_actor_system(cfg, cluster_spec{"test"});
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto policy = std::make_shared<policy_model>(small());
  policy->init_random(3, 0.2);
  auto rollout_model = std::make_shared<policy_model>(small());
  rollout_model->flat().copy_(policy->flat());
  auto initial = policy->flat().clone();

  rollout_setup rs;
  rs.model = rollout_model;
  rs.engine = {8, 32, 32};
  auto rollout = spawn_rollout(sys, rs);
  trainer_setup ts;
  ts.model = policy;
  ts.config.optimizer.lr = 5e-3;
  ts.rollouts = {rollout};  // no publisher: the trainer sends each version to the worker itself
  auto trainer = spawn_trainer(sys, ts);
  auto store = spawn_sample_store(sys, trainer);

  const std::vector<int32_t> prompt = {1, 2, 3};
  const int64_t target = 7;  // responses that start with this token are rewarded
  double before = first_token_probability(initial, prompt, target);
  for (int step = 0; step < 6; ++step) {
    std::vector<packed<trajectory>> batch;
    for (uint32_t k = 0; k < 8; ++k) {
      generation_request r;
      r.prompt_id = static_cast<uint64_t>(step);
      r.group_id = static_cast<uint64_t>(step);
      r.sample_index = k;
      r.prompt_tokens = prompt;
      r.sampling.max_new_tokens = 4;
      r.seed = static_cast<uint64_t>(step * 100 + k);
      self->request(rollout, 30s, *pack(r))
          .receive(
              [&](packed<trajectory>& p, std::string&) {
                auto t = *unpack(p);
                CHECK(t.token_versions.front() == step);  // the worker has the newest weights
                t.reward = t.output_tokens.front() == target ? 1.0f : 0.0f;
                batch.push_back(*pack(t));
              },
              [](caf::error& e) { FAIL(describe(e)); });
    }
    // Make sure the group carries signal: one sample always has the rewarded start.
    auto forced = *unpack(batch[0]);
    forced.output_tokens[0] = static_cast<int32_t>(target);
    forced.reward = 1.0f;
    batch[0] = *pack(forced);
    std::vector<uint64_t> slots;
    for (auto& t : batch)
      self->request(store, 30s, t)
          .receive(
              [&](sample_summary& s) {
                CHECK(s.group_id == static_cast<uint64_t>(step));
                CHECK(s.output_tokens == 4);
                slots.push_back(s.slot);
              },
              [](caf::error& e) { FAIL(describe(e)); });
    self->request(store, 60s, train_atom::value, slots)
        .receive(
            [&](train_report& report) {
              CHECK(report.version == step + 1);
              CHECK(report.samples == 8);
              CHECK(report.tokens == 32);
            },
            [](caf::error& e) { FAIL(describe(e)); });
    // The slots left the store with the batch: naming them again is refused.
    self->request(store, 30s, train_atom::value, slots)
        .receive([&](train_report&) { FAIL("a slot was trained twice"); }, [](caf::error&) {});
    self->request(store, 30s, stats_atom::value)
        .receive([&](uint64_t held) { CHECK(held == 0); }, [](caf::error& e) { FAIL(describe(e)); });
  }
  local_weights latest;
  self->request(trainer, 30s, weights_atom::value)
      .receive([&](local_weights& w) { latest = w; }, [](caf::error& e) { FAIL(describe(e)); });
  CHECK(latest.version == 6);
  double after = first_token_probability(*latest.flat, prompt, target);
  MESSAGE("P(first token = 7): " << before << " -> " << after);
  CHECK(after > before * 1.5);
  caf::anon_send_exit(rollout, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(trainer, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
}
