// The trainer side of a run (see job_parts.hpp, spawn_trainer_side): the
// trainer, the sample store beside it, the weight publisher and the
// evaluator, built from the configuration on whichever node has the trainer
// role (the controller's, or a node of its own).
#include <ATen/Parallel.h>

#include <caf/all.hpp>

#include <algorithm>
#include <thread>

#include "areal/actors/reward_pool.hpp"
#include "areal/actors/sample_store.hpp"
#include "areal/actors/trainer_actor.hpp"
#include "areal/actors/weight_transport.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/log.hpp"
#include "job_parts.hpp"

namespace areal::job {

eval_options make_eval_options(const run_config& c, const model_parts& m) {
  eval_options eo;
  eo.max_new_tokens = c.rl.max_new_tokens;
  eo.stop_tokens = {m.eos};
  eo.max_seq_len = max_sequence(m.config);
  eo.scoring = make_reward_pool_config(c.reward).scoring;
  return eo;
}

trainer_side spawn_trainer_side(caf::actor_system& sys, const run_config& c, const model_parts& m,
                                const trainer_side_setup& s) {
  auto& rl = c.rl;
  trainer_side side;
  std::string publish_device = "cpu";
  if (s.publish) {
    weight_publisher_setup ps;
    ps.name = s.node.name;
    ps.backend = *parse_weight_backend(c.cluster.weight_transport);
    ps.host = s.node.host;
    ps.device = publish_device = published_device(ps.backend, m.policy->flat().device().str());
    ps.chunk_bytes = c.cluster.weight_chunk_bytes;
    ps.timeout = std::chrono::milliseconds(c.cluster.transfer_timeout_ms);
    side.publisher = spawn_weight_publisher(sys, ps);
    // The current weights first, for the nodes that join.
    caf::scoped_actor boot{sys};
    auto initial = publishable_copy(s.initial_version, m.policy->flat(), ps.device);  // as every version
    auto failed = [](caf::error& err) { spdlog::warn("weight publisher: {}", describe(err)); };
    boot->request(side.publisher, ps.timeout, publish_atom::value, initial)
        .receive([](std::vector<weight_delivery>&) {}, failed);
    for (size_t i = 0; i < s.rollouts.size(); ++i)
      boot->request(side.publisher, ps.timeout, subscribe_atom::value, "rollout-" + std::to_string(i),
                    caf::actor_cast<caf::actor>(s.rollouts[i]), std::string{})
          .receive([](packed<weight_manifest>&, std::string&) {}, failed);
  }
  if (s.evals && !s.evals->prompts.empty()) {
    evaluator_setup es;
    es.model = m.config;
    es.model_options = m.policy->options();
    es.tokenizer = m.tokenizer;
    es.set = s.evals;
    es.options = make_eval_options(c, m);
    es.share = s.share;
    es.trace = s.trace;
    side.evaluator = spawn_evaluator(sys, es);
  }
  trainer_setup ts;
  ts.model = m.policy;
  ts.config = rl_trainer_config(c);
  ts.config.replica_devices = replica_devices(node_devices(c, s.node));
  if (rl.kl_coef > 0)
    ts.reference = reference_policy(s.run_dir, !s.resume_from.empty(), m);
  ts.shaping.bias = rl.reward_bias;
  ts.shaping.scale = rl.reward_scale;
  ts.shaping.clip = rl.reward_clip;
  ts.shaping.overlong_max_length = rl.max_new_tokens;
  ts.shaping.overlong_buffer = rl.overlong_buffer;
  ts.shaping.overlong_factor = rl.overlong_factor;
  ts.estimator = kernels::parse_estimator(rl.estimator);
  ts.initial_version = s.initial_version;
  ts.resume_from = s.resume_from;
  ts.tokenizer_json = m.tokenizer->to_json();
  ts.share = s.share;
  ts.trace = s.trace;
  ts.evaluator = side.evaluator;
  ts.publisher = side.publisher;
  ts.publish_device = publish_device;
  if (!side.publisher)
    ts.rollouts = s.rollouts;
  ts.publish_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.cluster.request_timeout_s * 1000));
  side.trainer = spawn_trainer(sys, ts);
  side.store = spawn_sample_store(sys, side.trainer,
                                  rl.record_trajectories ? (s.run_dir / "trajectories.jsonl").string() : std::string{});
  return side;
}

trainer_side remote_trainer_side(caf::actor_system& sys, const run_config& c, node_actor node, const node_spec& self,
                                 const std::filesystem::path& run_dir, const model_parts& m,
                                 const std::string& resume_from, int64_t initial_version,
                                 const std::vector<rollout_actor>& rollouts, double wait_s) {
  // The trainer's node loads the weights the run starts from: the checkpoint's, or these.
  auto model_dir = resume_from.empty() ? (run_dir / "initial_model").string()
                                       : (std::filesystem::path{resume_from} / "model").string();
  if (resume_from.empty())
    m.policy->save(model_dir);
  if (wait_s < 0)
    wait_s = c.cluster.connect_timeout_s;
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
  spdlog::info("RL: the trainer runs on another node; waiting up to {} s for it", wait_s);
  caf::scoped_actor ask{sys};
  trainer_side side;
  std::string failed;
  ask->request(node, timeout, trainer_atom::value, model_dir, resume_from, initial_version, run_dir.string())
      .receive(
          [&](caf::actor& trainer, caf::actor& store, caf::actor& publisher, caf::actor& evaluator) {
            side.trainer = caf::actor_cast<trainer_actor>(trainer);
            side.store = caf::actor_cast<sample_store_actor>(store);
            side.publisher = caf::actor_cast<weight_publisher_actor>(publisher);
            side.evaluator = caf::actor_cast<evaluator_actor>(evaluator);
          },
          [&](caf::error& e) { failed = describe(e); });
  if (!failed.empty() || !side.trainer || !side.store || !side.publisher)
    throw job_error("the trainer's node did not start the trainer (" + (failed.empty() ? "no trainer" : failed) +
                    "); start the node with the trainer role (areal --config TOPOLOGY --node NAME), "
                    "and give the run directory the same path there (the trainer writes the checkpoints)");
  spdlog::info("RL: the trainer runs on its own node");
  if (!rollouts.empty()) {
    side.subscriber =
        spawn_weight_subscriber(sys, rollout_subscription(c, self, caf::actor_cast<caf::actor>(side.publisher),
                                                          rollouts, static_cast<uint64_t>(m.policy->flat().nbytes())));
  }
  return side;
}

void check_resume_state(const controller_checkpoint& saved, const std::string& dir, const run_config& c) {
  auto version = kernels::trainer::checkpoint_version(dir);
  if (version != saved.version)
    throw job_error(dir + ": the controller's record says policy version " + std::to_string(saved.version) +
                    " and the trainer's state " + std::to_string(version) +
                    ": the checkpoint is damaged or mixed from two runs; resume from a complete one");
  if (saved.steps > c.rl.steps)
    throw job_error(dir + ": the checkpoint has " + std::to_string(saved.steps) + " steps done, past rl.steps = " +
                    std::to_string(c.rl.steps) + "; to train further raise rl.steps (e.g. --set rl.steps=" +
                    std::to_string(saved.steps + c.rl.steps) + ")");
}

std::pair<trainer_side, controller_checkpoint> rejoined_trainer_side(caf::actor_system& sys, const run_config& c,
                                                                     node_actor node, const node_spec& self,
                                                                     const std::filesystem::path& run_dir,
                                                                     const model_parts& m,
                                                                     const std::vector<rollout_actor>& rollouts,
                                                                     const std::string& why) {
  auto last = kernels::trainer::complete_checkpoint((run_dir / "checkpoint").string());
  if (last.empty())
    throw job_error("the trainer's node was lost before the first checkpoint: there is nothing to go back to");
  spdlog::warn(
      "{}: waiting up to {} s for the trainer's node to join again (cluster.trainer_rejoin_s); the run "
      "goes back to {} then",
      why, c.cluster.trainer_rejoin_s, last);
  auto record = controller_checkpoint::load(last);
  check_resume_state(record, last, c);
  // The node actor may still hand the request to the lost node's members
  // (it learns of the loss a moment later): refused, it is asked again.
  using clock = std::chrono::steady_clock;
  auto until = clock::now() +
               std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(c.cluster.trainer_rejoin_s));
  for (;;) {
    try {
      auto left_s = std::max(0.001, std::chrono::duration<double>(until - clock::now()).count());
      return {remote_trainer_side(sys, c, node, self, run_dir, m, last, record.version, rollouts, left_s), record};
    } catch (const job_error& e) {
      if (clock::now() + std::chrono::seconds(1) >= until)
        throw job_error(std::string{"no trainer joined again: "} + e.what());
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
}

trainer_side start_trainer_side(caf::actor_system& sys, const run_config& c, const node_spec& self,
                                const std::string& model_dir, const std::string& resume_from, int64_t initial_version,
                                const std::string& run_dir, std::shared_ptr<tracer> trace) {
  auto threads = static_cast<int>(self.compute_threads);
  kernels::set_compute_threads(threads);
  auto m = make_model(c, self);
  auto start = kernels::policy_model::load(model_dir);
  if (start.flat().numel() != m.policy->flat().numel())
    throw job_error(model_dir + ": the model differs from the configured one; give every node the same configuration");
  m.policy->flat().copy_(start.flat());
  trainer_side_setup ts;
  ts.initial_version = initial_version;
  ts.resume_from = resume_from;
  ts.run_dir = run_dir;
  ts.publish = true;
  ts.node = self;
  ts.evals = make_eval_set(c, m);
  ts.share = std::make_shared<compute_share>(threads, true, 1);
  ts.trace = std::move(trace);
  spdlog::info("the trainer starts from {} (version {}{})", model_dir, initial_version,
               resume_from.empty() ? "" : ", resuming " + resume_from);
  auto side = spawn_trainer_side(sys, c, m, ts);
  kernels::release_compute_threads();  // the loading's workers; this thread waits from here (compute_share.hpp)
  return side;
}

void stop_trainer_side(const trainer_side& side) {
  caf::anon_send_exit(side.trainer, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(side.store, caf::exit_reason::user_shutdown);
  if (side.publisher)
    caf::anon_send_exit(side.publisher, caf::exit_reason::user_shutdown);
  if (side.evaluator)
    caf::anon_send_exit(side.evaluator, caf::exit_reason::user_shutdown);
  if (side.subscriber)
    caf::anon_send_exit(side.subscriber, caf::exit_reason::user_shutdown);
}

}  // namespace areal::job
