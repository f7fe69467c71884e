// The pipeline in one process: controller, two rollout workers, the reward
// pool and the trainer. Every admitted sample is trained or dropped with a
// reason, and no trained trajectory is staler than eta versions.
#include <caf/all.hpp>

#include "areal/actors/controller.hpp"
#include "areal/actors/node.hpp"
#include "areal/actors/reward_pool.hpp"
#include "areal/actors/rollout.hpp"
#include "areal/actors/trainer_actor.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal;
using namespace areal::kernels;
using namespace std::chrono_literals;

namespace {

controller_stats run_pipeline(int64_t eta, int64_t steps) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg, cluster_spec{"test"});
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto tok =
      std::make_shared<const tokenizer>(tokenizer::character_level(tasks::running_sum_alphabet(), {"<unk>", "<eos>"}));
  auto config = test::small_model_config(tok->vocab_size());
  auto policy = std::make_shared<policy_model>(config);
  policy->init_random(11, 0.2);
  std::vector<rollout_actor> rollouts;
  for (int i = 0; i < 2; ++i) {
    auto copy = std::make_shared<policy_model>(config);
    copy->flat().copy_(policy->flat());
    rollout_setup rs;
    rs.name = "rollout-" + std::to_string(i);
    rs.model = copy;
    rs.tokenizer = tok;
    rs.engine = {8, 96, 64, true};
    rollouts.push_back(spawn_rollout(sys, rs));
  }
  trainer_setup ts;
  ts.model = policy;
  auto trainer = spawn_trainer(sys, ts);
  auto reward = spawn_reward_pool(sys, reward_pool_config{});

  controller_setup cs;
  cs.source = tasks::running_sum_generator({});
  cs.tokenizer = tok;
  cs.group_size = 4;
  cs.batch_size = 8;
  cs.eta = eta;
  cs.max_concurrent = 24;
  cs.rollout_slots = 8;
  cs.total_steps = steps;
  cs.sampling.max_new_tokens = 10;
  cs.sampling.stop_tokens = {*tok->token_id("<eos>")};
  cs.rollouts = rollouts;
  cs.reward = reward;
  cs.trainer = trainer;
  cs.listener = caf::actor{self};
  auto controller = spawn_controller(sys, std::move(cs));
  int32_t code = -1;
  self->receive([&](done_atom, int32_t c, std::string&) { code = c; },
                caf::after(120s) >> [] { FAIL("the run did not finish"); });
  CHECK(code == 0);
  controller_stats stats;
  self->request(controller, 10s, stats_atom::value)
      .receive([&](controller_stats& s) { stats = s; }, [](caf::error& e) { FAIL(describe(e)); });
  for (auto& r : rollouts)
    self->send_exit(r, caf::exit_reason::user_shutdown);
  self->send_exit(trainer, caf::exit_reason::user_shutdown);
  self->send_exit(reward, caf::exit_reason::user_shutdown);
  self->send_exit(controller, caf::exit_reason::user_shutdown);
  return stats;
}

}  // namespace

TEST_CASE("the asynchronous pipeline accounts for every sample and keeps the staleness bound") {
  for (int64_t eta : {0, 2}) {
    INFO("eta " << eta);
    auto stats = run_pipeline(eta, 4);
    CHECK(stats.steps == 4);
    CHECK(stats.version == 4);
    CHECK(stats.trained == 4 * 8);
    CHECK(stats.admitted == stats.trained + stats.dropped);  // every admitted sample accounted for once
    CHECK(stats.max_staleness <= eta);
    MESSAGE("eta " << eta << ": admitted " << stats.admitted << ", trained " << stats.trained << ", dropped "
                   << stats.dropped << ", max staleness " << stats.max_staleness);
  }
}
