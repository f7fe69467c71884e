// The RL job on the controller's node (see rl_job.hpp): the warm start, the
// pipeline of actors, the loop that watches them, the final evaluation and
// the run's outputs.
#include "areal/actors/rl_job.hpp"
#include "areal/kernels/compute_threads.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <utility>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "agent_program.hpp"
#include "areal/actors/controller.hpp"
#include "areal/actors/evaluator.hpp"
#include "areal/actors/node.hpp"
#include "areal/actors/reward_pool.hpp"
#include "areal/actors/rollout.hpp"
#include "areal/actors/sample_store.hpp"
#include "areal/actors/trainer_actor.hpp"
#include "areal/actors/weight_transport.hpp"
#include "areal/kernels/model_config.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/files.hpp"
#include "areal/runtime/log.hpp"
#include "areal/runtime/report.hpp"
#include "job_parts.hpp"

namespace fs = std::filesystem;

namespace areal {

using namespace job;

namespace {

// User and system CPU time of every thread of this process so far.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// What the configuration tells the controller: the prompts, the batch and
// its staleness bound, sampling, the seed, the deadlines. The job adds the
// actors and the run's files.
controller_setup controller_settings(const run_config& c, const model_parts& m) {
  auto& rl = c.rl;
  auto ms = [](double seconds) { return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); };
  controller_setup cs;
  cs.source = training_source(c, m);
  cs.encode = [tokenizer = m.tokenizer](const std::string& text) { return tokenizer->encode(text); };
  cs.group_size = rl.group_size;
  cs.batch_size = rl.batch_size;
  cs.eta = rl.effective_eta();
  cs.max_concurrent = rl.max_concurrent;
  cs.rollout_slots = rl.rollout_slots;
  cs.total_steps = rl.steps;
  cs.sampling = rollout_sampling(c, m.eos);
  cs.seed = stream_seed(c.run.seed, 7);
  cs.checkpoint_every = rl.checkpoint_every;
  cs.request_timeout = ms(c.cluster.request_timeout_s);
  cs.trainer_timeout = ms(c.cluster.trainer_timeout_s);
  cs.member_timeout = ms(c.cluster.connect_timeout_s);
  cs.agent_episodes = c.task.kind == "agent";
  cs.episode_timeout = ms(c.endpoint.episode_timeout_s);
  return cs;
}

// The model a run starts from: the configured one, or with --resume the
// weights of the last complete checkpoint and the controller's record beside
// them. Throws job_error (exit 2) saying what to change.
struct run_start {
  model_parts m;
  std::optional<controller_checkpoint> resume;
  std::string resume_from;  // the checkpoint's directory, with --resume
  std::shared_ptr<eval_set> evals;
};

run_start load_run_start(const rl_job_options& options, const std::string& checkpoint_dir) {
  auto& c = options.config;
  run_start r;
  r.m = make_model(c, options.self);
  for (auto& note : r.m.data->notes)
    spdlog::info("{}", note);
  for (auto& warning : r.m.data->warnings)
    spdlog::warn("{}", warning);
  r.evals = make_eval_set(c, r.m);
  if (!options.resume)
    return r;
  r.resume_from = kernels::trainer::complete_checkpoint(checkpoint_dir);
  if (r.resume_from.empty())
    throw job_error("--resume: no checkpoint in " + checkpoint_dir + "; start the run without --resume");
  r.resume = controller_checkpoint::load(r.resume_from);
  check_resume_state(*r.resume, r.resume_from, c);
  auto saved = kernels::policy_model::load((fs::path{r.resume_from} / "model").string());
  if (saved.flat().numel() != r.m.policy->flat().numel())
    throw job_error(r.resume_from +
                    ": the checkpoint's model differs from the configured one; resume with the "
                    "configuration the run started with (" +
                    (options.run_dir / "config.toml").string() + ")");
  r.m.policy->flat().copy_(saved.flat());
  spdlog::info("resuming from {}: version {}, {} steps done, {} groups to generate again", r.resume_from,
               r.resume->version, r.resume->steps, r.resume->requeue.size());
  return r;
}

rl_job_result run_job(caf::actor_system& sys, const rl_job_options& options, const std::atomic<bool>& stop) {
  rl_job_result result;
  auto& c = options.config;
  auto& rl = c.rl;
  fs::create_directories(options.run_dir);
  auto checkpoint_dir = (options.run_dir / "checkpoint").string();
  progress_line progress{options.progress};
  kernels::set_compute_threads(options.compute_threads);

  // The run's timeline, and the live dashboard from the start (a port in use is refused before any work).
  auto trace = std::make_shared<tracer>("areal " + c.run.name);
  std::unique_ptr<report::dashboard> dashboard;
  if (c.run.dashboard_port > 0) {
    try {
      dashboard = std::make_unique<report::dashboard>(options.run_dir, c.run.dashboard_port, trace);
      spdlog::info("live dashboard at {} (run.dashboard_port)", dashboard->address());
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      result.exit_code = 2;
      result.why = e.what();
      return result;
    }
  }

  run_start begin;
  try {
    begin = load_run_start(options, checkpoint_dir);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    result.exit_code = 2;
    result.why = e.what();
    return result;
  }
  auto& m = begin.m;
  auto& resume = begin.resume;
  auto& resume_from = begin.resume_from;
  auto& evals = begin.evals;
  if (resume && resume->steps >= rl.steps) {  // more steps than rl.steps were refused by check_resume_state
    // Nothing left to train: the run's checkpoint, metrics and summary stay as it left them (before, the
    // whole job started, evaluated twice and wrote the same checkpoint again).
    result.why = "the run already did all its rl.steps = " + std::to_string(rl.steps) +
                 " steps: nothing to train; to train it further, resume with a larger rl.steps (--resume --set " +
                 "rl.steps=" + std::to_string(std::max<int64_t>(2 * rl.steps, rl.steps + 1)) + ")";
    spdlog::info("{}", result.why);
    return result;
  }

  std::vector<kernels::sft_sample> transcripts;  // an agent run's demonstrations
  if (!resume && c.sft.steps > 0 && c.task.kind == "agent") {
    try {
      transcripts = agent_demonstrations(c, *model_chat_template(c, m), max_sequence(m.config), options.run_dir);
    } catch (const std::exception& e) {  // job_error, kernels::template_error
      spdlog::error("{}", e.what());
      result.exit_code = 2;
      result.why = e.what();
      return result;
    }
  }
  if (!resume && c.sft.steps > 0) {
    auto start = clock_type::now();
    if (!warm_start(c, m, options.compute_threads, options.self, stop, progress, transcripts)) {
      result.why = "stopped during the warm start; nothing to resume";
      spdlog::info("{}", result.why);
      return result;
    }
    result.sft_seconds = seconds_since(start);
    // Kept in Hugging Face layout: a later run can start from it (model.path) without the warm start.
    auto kept = options.run_dir / "sft_model";
    m.policy->save(kept.string());
    m.tokenizer->save((kept / "tokenizer.json").string());
  }
  if (!evals->prompts.empty()) {
    auto eo = make_eval_options(c, m);
    eo.stop = &stop;
    auto r = evaluate_policy(*m.policy, *m.tokenizer, *evals, eo);
    if (r.stopped) {
      result.why = "stopped during the evaluation before RL";
      spdlog::info("{}", result.why);
      return result;
    }
    result.accuracy_before = r.accuracy;
    if (!resume)  // a resumed run's metrics are cut back to its checkpoint by the controller: none written here
      eval_line(options.run_dir, "before", 0, 0, r.accuracy, r.mean_tokens,
                static_cast<int64_t>(evals->prompts.size()));
    else if (auto at_start = recorded_accuracy_before(options.run_dir, static_cast<int64_t>(evals->prompts.size())))
      result.accuracy_before = *at_start;  // RL's gain is counted from the run's start, not from the resume
    spdlog::info("held-out greedy accuracy {} RL: {:.1f}% ({} prompts; {})", resume ? "at resume, during" : "before",
                 100 * r.accuracy, evals->prompts.size(), by_difficulty_text(r));
  }

  // The pipeline.
  int actors = 2;  // rollout side and trainer side
  // The trainer's next batch follows a step within 2 ms (median) to 5 ms (90th
  // percentile) in the demo's asynchronous run; a synchronous one generates it
  // first, with every thread.
  auto linger = rl.synchronous ? std::chrono::milliseconds{0} : std::chrono::milliseconds{10};
  auto share = std::make_shared<compute_share>(options.compute_threads, options.share_cores || rl.synchronous, actors,
                                               linger);
  bool multi_node = static_cast<bool>(options.node);
  std::vector<rollout_actor> rollouts;
  if (!multi_node || options.self.has(role::rollout))
    rollouts = spawn_rollout_workers(sys, c, m, options.self, share, trace, resume ? resume->version : 0, "rollout-");
  // The trainer side: in this process, or on the node with the trainer role.
  bool remote_trainer = multi_node && !options.self.has(role::trainer);
  int64_t initial_version = resume ? resume->version : 0;
  trainer_side side;
  if (!remote_trainer) {
    trainer_side_setup ts;
    ts.initial_version = initial_version;
    ts.resume_from = resume_from;
    ts.run_dir = options.run_dir;
    ts.publish = multi_node;
    ts.node = options.self;
    ts.rollouts = rollouts;
    if (c.eval.every > 0)
      ts.evals = evals;
    ts.share = share;
    ts.trace = trace;
    side = spawn_trainer_side(sys, c, m, ts);
  } else {
    try {
      side = remote_trainer_side(sys, c, options.node, options.self, options.run_dir, m, resume_from, initial_version,
                                 rollouts);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      result.exit_code = 1;
      result.why = e.what();
      return result;
    }
  }
  auto& trainer = side.trainer;
  auto& store = side.store;
  auto& publisher = side.publisher;
  auto& evaluator = side.evaluator;
  auto reward_config = make_reward_pool_config(c.reward);
  reward_config.trace = trace;
  reward_pool_actor reward;
  if (!multi_node || options.self.has(role::reward))
    reward = spawn_reward_pool(sys, reward_config);

  caf::scoped_actor self{sys};
  auto cs = controller_settings(c, m);
  cs.rollouts = rollouts;
  cs.reward = reward;
  cs.trainer = trainer;
  cs.store = store;
  cs.remote_weights = static_cast<bool>(publisher);
  cs.eval_every = evaluator && c.eval.every > 0 ? c.eval.every : 0;
  cs.metrics_path = (options.run_dir / "metrics.jsonl").string();
  cs.checkpoint_dir = checkpoint_dir;
  cs.resume = resume;
  cs.trace = trace;
  cs.listener = caf::actor_cast<done_listener_actor>(caf::actor{self});
  // A trainer on a node of its own may be lost and join again (agent episodes are with their agents: not those).
  bool trainer_rejoin = remote_trainer && c.cluster.trainer_rejoin_s > 0 && c.task.kind != "agent";
  if (trainer_rejoin)
    cs.trainer_rejoin = std::chrono::milliseconds(static_cast<int64_t>(c.cluster.trainer_rejoin_s * 1000));
  spdlog::info("RL: {} mode, eta {}, {} steps of {} trajectories ({} prompts x {} samples), {} compute threads ({})",
               rl.synchronous ? "synchronous" : "asynchronous", rl.effective_eta(), rl.steps, rl.batch_size,
               rl.batch_size / rl.group_size, rl.group_size, options.compute_threads,
               options.share_cores || rl.synchronous ? "shared" : "static split");
  auto controller = spawn_controller(sys, std::move(cs));
  std::unique_ptr<http_endpoint> endpoint;
  if (options.self.http_port > 0) {
    try {
      endpoint = start_endpoint(sys, c, options.self, m, rollouts, controller, store);
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      self->send(controller, shutdown_atom::value, int32_t{2}, std::string{e.what()});
    }
  }
  if (multi_node) {
    caf::anon_send(options.node, publisher_atom::value, caf::actor_cast<caf::actor>(controller),
                   caf::actor_cast<caf::actor>(publisher));
    spdlog::info("RL: taking rollout workers and reward pools from the other nodes as they join");
  }

  // This thread's OpenMP workers (the warm start's, the evaluation's, the
  // loading's) would shorten the spin of the pipeline's (compute_share.hpp).
  kernels::release_compute_threads();

  // Every actor this job spawned is watched: one that dies ends the run
  // (with the controller's checkpoint, when the trainer can still write it).
  std::map<caf::actor_addr, std::string> watched;
  auto watch = [&](const auto& handle, const std::string& name) {
    if (!handle)
      return;
    self->monitor(handle);
    watched[handle.address()] = name;
  };
  watch(controller, "the controller");
  watch(trainer, "the trainer");
  watch(store, "the sample store");
  watch(reward, "the reward pool");
  watch(publisher, "the weight publisher");
  watch(evaluator, "the evaluator");
  for (size_t i = 0; i < rollouts.size(); ++i)
    watch(rollouts[i], "rollout worker " + std::to_string(i));
  if (options.on_started)
    options.on_started(rl_job_actors{controller, trainer, store, reward, rollouts, evaluator, publisher,
                                     endpoint ? endpoint->port() : uint16_t{0}});
  std::string lost;  // why an actor of the job stopped
  clock_type::time_point lost_at;
  std::string trainer_gone;  // the trainer side stopped and may join again (trainer_rejoin)
  auto is_trainer_side = [&](const caf::actor_addr& a) {
    return a == trainer.address() || a == store.address() || a == publisher.address() ||
           (evaluator && a == evaluator.address());
  };
  // The trainer's node was lost: the controller pauses; a trainer that joins
  // within cluster.trainer_rejoin_s starts from the last checkpoint, and the
  // controller goes back to it. Blocks this thread while it waits.
  auto rejoin_trainer = [&] {
    auto why = std::exchange(trainer_gone, std::string{});
    for (auto a : {caf::actor_cast<caf::actor>(trainer), caf::actor_cast<caf::actor>(store),
                   caf::actor_cast<caf::actor>(publisher), caf::actor_cast<caf::actor>(evaluator)})
      if (a)
        watched.erase(a.address());
    if (side.subscriber)
      self->send_exit(side.subscriber, caf::exit_reason::user_shutdown);
    self->send(controller, trainer_atom::value);
    progress.close();
    try {
      auto [rejoined, record] =
          rejoined_trainer_side(sys, c, options.node, options.self, options.run_dir, m, rollouts, why);
      side = std::move(rejoined);
      watch(trainer, "the trainer");
      watch(store, "the sample store");
      watch(publisher, "the weight publisher");
      watch(evaluator, "the evaluator");
      caf::anon_send(options.node, publisher_atom::value, caf::actor_cast<caf::actor>(controller),
                     caf::actor_cast<caf::actor>(publisher));
      self->send(controller, trainer_atom::value, caf::actor_cast<caf::actor>(trainer),
                 caf::actor_cast<caf::actor>(store), record.to_bytes());
    } catch (const std::exception& e) {
      lost = why + "; " + e.what();
      lost_at = clock_type::now();
      spdlog::error("{}: ending the run", lost);
      self->send(controller, shutdown_atom::value, int32_t{1}, lost);
    }
  };

  // The agent program (agent.command): held-out episodes, then the training episodes beside the RL loop.
  std::unique_ptr<agent_program> agent;
  std::string agent_key;
  if (endpoint && !c.agent.command.empty()) {
    try {
      agent_key = endpoint_api_key(c);
      if (c.agent.eval_episodes > 0)
        if (auto r = agent_evaluation(c, *endpoint, agent_key, stop, "before"))
          result.accuracy_before = *r;
      agent = std::make_unique<agent_program>(c, agent_environment(c, endpoint->port(), agent_key, "train"));
    } catch (const job_error& e) {
      spdlog::error("{}", e.what());
      self->send(controller, shutdown_atom::value, int32_t{2}, std::string{e.what()});
    }
  }

  auto rl_start = clock_type::now();
  auto rl_cpu_start = process_cpu_seconds();
  // Where the RL phase of this process started: a resumed run counts its speed from there.
  progress_origin since_start{rl_start, resume ? resume->steps : 0, resume ? resume->trained : 0};
  bool done = false, stop_sent = false;
  while (!done) {
    self->receive(
        [&](done_atom, int32_t code, std::string& why) {
          done = true;
          result.exit_code = code;
          result.why = lost.empty() ? why : lost + "; " + why;
        },
        [&](caf::down_msg& down) {
          auto it = watched.find(down.source);
          if (it == watched.end() || !lost.empty())
            return;
          if (trainer_rejoin && is_trainer_side(down.source)) {
            trainer_gone = it->second + " stopped (" + describe(down.reason) + ")";
            return;  // handled after this message
          }
          lost = it->second + " stopped (" + describe(down.reason) + ")";
          lost_at = clock_type::now();
          progress.close();
          spdlog::error("{}: ending the run", lost);
          if (down.source == controller.address()) {
            done = true;
            result.exit_code = 1;
            result.why = lost;
          } else {
            self->send(controller, shutdown_atom::value, int32_t{1}, lost);
          }
        },
        caf::after(std::chrono::milliseconds(250)) >>
            [&] {
              if (!lost.empty() && seconds_since(lost_at) > 30) {
                done = true;  // the controller did not end the run in time
                result.exit_code = 1;
                result.why = lost + "; the controller did not end the run within 30 s";
                return;
              }
              // An agent that exits leaves nothing to train on. Status 0 may be its
              // answer to the run's end (503) racing the controller's word: 30 s of grace.
              if (agent && lost.empty())
                if (auto status = agent->wait(std::chrono::milliseconds(0));
                    status && (*status != 0 || seconds_since(*agent->exited_at()) > 30)) {
                  lost = "the agent program (mode train) exited with status " + std::to_string(*status) +
                         " before the run ended";
                  lost_at = clock_type::now();
                  progress.close();
                  spdlog::error("{}: ending the run", lost);
                  self->send(controller, shutdown_atom::value, int32_t{1}, lost);
                }
              if (stop.load() && !stop_sent) {
                stop_sent = true;
                progress.close();
                spdlog::info("stopping at the next step boundary; a checkpoint will be written");
                self->send(controller, shutdown_atom::value, std::string{"stopped by a signal"});
              }
              self->request(controller, std::chrono::seconds(5), stats_atom::value)
                  .receive([&](controller_stats& s) { progress.show(progress_text(s, rl.steps, since_start)); },
                           [](caf::error&) {});
            });
    if (!trainer_gone.empty() && !done)
      rejoin_trainer();
  }
  progress.close();
  result.rl_seconds = seconds_since(rl_start);
  result.rl_cpu_seconds = process_cpu_seconds() - rl_cpu_start;
  if (agent && !agent->wait(std::chrono::seconds(30))) {
    spdlog::warn("the agent program (mode train) did not exit within 30 s of the run's end; stopping it");
    agent->stop();
  }
  agent.reset();
  if (endpoint && c.agent.eval_episodes > 0 && result.exit_code == 0 && !stop.load()) {
    try {
      if (auto r = agent_evaluation(c, *endpoint, agent_key, stop, "after"))
        result.accuracy_after = *r;
    } catch (const job_error& e) {
      spdlog::error("{}", e.what());
    }
  }
  nlohmann::json endpoint_record;  // the endpoint's counts, for summary.json
  if (endpoint) {
    endpoint_record = endpoint_summary(*endpoint);
    endpoint.reset();  // open episodes are dropped; nothing more arrives
  }
  self->request(controller, std::chrono::seconds(10), stats_atom::value)
      .receive([&](controller_stats& s) { result.stats = s; }, [](caf::error&) {});
  if (reward)
    self->request(reward, std::chrono::seconds(10), stats_atom::value)
        .receive(
            [&](reward_pool_stats& s) {
              result.reward = s;
              spdlog::info("reward pool: {} scored, {} refused while full (sent again later), {} timeouts, {} errors",
                           s.scored, s.refused, s.timeouts, s.errors);
            },
            [](caf::error&) {});

  // Evaluation of the final weights.
  if (!evals->prompts.empty() && result.exit_code == 0) {
    auto eo = make_eval_options(c, m);
    eo.stop = &stop;
    evaluate_final(self, side, remote_trainer, m, *evals, eo, options.run_dir,
                   (resume ? resume->elapsed_s : 0.0) + result.rl_seconds, result);
  }
  for (auto& r : rollouts)
    self->send_exit(r, caf::exit_reason::user_shutdown);
  if (!remote_trainer)
    stop_trainer_side(side);  // a remote one ends with its node
  else if (side.subscriber)
    self->send_exit(side.subscriber, caf::exit_reason::user_shutdown);
  if (reward)
    self->send_exit(reward, caf::exit_reason::user_shutdown);
  self->send_exit(controller, caf::exit_reason::user_shutdown);

  if (multi_node)
    merge_node_traces(self, options.node, *trace);
  write_outputs(options.run_dir, rl, endpoint_record, *trace, result);
  return result;
}

}  // namespace

// No exception leaves the job: bad input found late is exit 2, anything else exit 1, with the reason.
rl_job_result run_rl_job(caf::actor_system& sys, const rl_job_options& options, const std::atomic<bool>& stop) {
  rl_job_result failed;
  try {
    return run_job(sys, options, stop);
  } catch (const job_error& e) {
    failed.exit_code = 2;
    failed.why = e.what();
  } catch (const std::exception& e) {
    failed.exit_code = 1;
    failed.why = std::string{"the run failed: "} + e.what();
  }
  spdlog::error("{}", failed.why);
  return failed;
}

rl_job_result run_rl_job(const rl_job_options& options, const std::atomic<bool>& stop) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg, options.config.cluster);
  caf::actor_system sys{cfg};
  return run_rl_job(sys, options, stop);
}

}  // namespace areal
