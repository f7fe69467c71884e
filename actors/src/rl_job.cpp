// The single-node RL job (see rl_job.hpp).
#include "areal/actors/rl_job.hpp"

#include <unistd.h>

#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "areal/actors/controller.hpp"
#include "areal/actors/evaluator.hpp"
#include "areal/actors/node.hpp"
#include "areal/actors/reward_pool.hpp"
#include "areal/actors/rollout.hpp"
#include "areal/actors/trainer_actor.hpp"
#include "areal/actors/weight_transport.hpp"
#include "areal/kernels/model_config.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/log.hpp"

namespace fs = std::filesystem;

namespace areal {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// Why the job cannot start; the text says what to do.
struct job_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// -- data ---------------------------------------------------------------------

tasks::running_sum_options sum_options(const task_spec& t, uint64_t seed) {
  tasks::running_sum_options o;
  o.seed = seed;
  o.max_value = static_cast<int>(t.max_value);
  o.median_terms = t.median_terms;
  o.max_terms = static_cast<int>(t.max_terms);
  return o;
}

// Three disjoint random streams of one seed: RL prompts, SFT demonstrations, held-out prompts.
uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  return seed * 0x9E3779B97F4A7C15ull + stream;
}

std::unique_ptr<tasks::task_source> training_source(const run_config& c) {
  if (c.task.kind == "jsonl") {
    auto source = tasks::jsonl_source(c.task.train_path);
    if (c.task.eval_path.empty())
      source->restore(static_cast<uint64_t>(c.eval.prompts));  // the first items are held out
    return source;
  }
  return tasks::running_sum_generator(sum_options(c.task, stream_seed(c.run.seed, 1)));
}

std::unique_ptr<tasks::task_source> demonstration_source(const run_config& c) {
  if (c.task.kind == "jsonl")
    return training_source(c);
  auto o = sum_options(c.task, stream_seed(c.run.seed, 2));
  o.truncated_fraction = c.task.truncated_fraction;
  return tasks::running_sum_generator(o);
}

std::vector<tasks::task_item> held_out_items(const run_config& c) {
  std::unique_ptr<tasks::task_source> source;
  if (c.task.kind == "jsonl")
    source = tasks::jsonl_source(c.task.eval_path.empty() ? c.task.train_path : c.task.eval_path);
  else
    source = tasks::running_sum_generator(sum_options(c.task, stream_seed(c.run.seed, 3)));
  std::vector<tasks::task_item> items;
  while (static_cast<int64_t>(items.size()) < c.eval.prompts) {
    auto item = source->next();
    if (!item)
      break;
    items.push_back(std::move(*item));
  }
  return items;
}

// The characters of every prompt and solution (for a character-level tokenizer of JSONL data).
std::string alphabet_of(const run_config& c) {
  if (c.task.kind != "jsonl")
    return tasks::running_sum_alphabet();
  std::set<char> chars;
  for (auto* path : {&c.task.train_path, &c.task.eval_path}) {
    if (path->empty())
      continue;
    auto source = tasks::jsonl_source(*path);
    while (auto item = source->next())
      for (auto* text : {&item->prompt, &item->worked_solution})
        chars.insert(text->begin(), text->end());
  }
  return std::string(chars.begin(), chars.end());
}

// -- model --------------------------------------------------------------------

struct model_parts {
  std::shared_ptr<const kernels::tokenizer> tokenizer;
  kernels::model_config config;
  std::shared_ptr<kernels::policy_model> policy;
  int32_t eos = 0;
};

model_parts make_model(const run_config& c) {
  model_parts m;
  if (!c.model.path.empty()) {
    auto tokenizer_file = fs::path{c.model.path} / "tokenizer.json";
    if (!fs::exists(tokenizer_file))
      throw job_error(c.model.path +
                      ": no tokenizer.json; a model directory needs config.json, weights and "
                      "tokenizer.json");
    m.tokenizer = std::make_shared<const kernels::tokenizer>(kernels::tokenizer::load(tokenizer_file.string()));
    m.policy = std::make_shared<kernels::policy_model>(kernels::policy_model::load(c.model.path));
    m.config = m.policy->config();
  } else {
    m.tokenizer = std::make_shared<const kernels::tokenizer>(
        kernels::tokenizer::character_level(alphabet_of(c), {"<unk>", "<eos>"}));
    m.config = kernels::preset(c.model.preset, m.tokenizer->vocab_size());
    m.config.max_position_embeddings = 1024;
    m.policy = std::make_shared<kernels::policy_model>(m.config);
    m.policy->init_random(stream_seed(c.run.seed, 4));
  }
  for (auto name : {"<eos>", "<|endoftext|>", "</s>", "<|im_end|>"})
    if (auto id = m.tokenizer->token_id(name)) {
      m.eos = *id;
      return m;
    }
  throw job_error("the tokenizer has no end-of-sequence token (<eos>, <|endoftext|>, </s> or <|im_end|>)");
}

// -- the progress line --------------------------------------------------------

std::string duration_text(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream os;
  if (s >= 3600)
    os << s / 3600 << "h" << (s % 3600) / 60 << "m";
  else if (s >= 60)
    os << s / 60 << "m" << s % 60 << "s";
  else
    os << s << "s";
  return os.str();
}

class progress_line {
 public:
  explicit progress_line(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {}

  void show(const std::string& text) {
    if (!enabled_)
      return;
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", text.c_str());
      std::fflush(stderr);
      open_ = true;
    } else if (seconds_since(last_) >= 10) {  // a log, not a terminal: one line now and then
      std::fprintf(stderr, "%s\n", text.c_str());
      last_ = clock_type::now();
    }
  }
  void close() {
    if (open_)
      std::fprintf(stderr, "\n");
    open_ = false;
  }

 private:
  bool enabled_, tty_, open_ = false;
  clock_type::time_point last_ = clock_type::now();
};

// -- supervised warm start ----------------------------------------------------

bool warm_start(const run_config& c, model_parts& m, const std::atomic<bool>& stop, progress_line& progress) {
  kernels::trainer_config tc;
  tc.optimizer.lr = c.sft.lr;
  tc.optimizer.warmup_steps = c.sft.warmup_steps;
  tc.optimizer.schedule = "cosine";
  tc.optimizer.total_steps = c.sft.steps;
  tc.optimizer.min_lr_ratio = 0.1;
  tc.seed = stream_seed(c.run.seed, 5);
  kernels::trainer sft(*m.policy, tc);
  auto source = demonstration_source(c);
  auto start = clock_type::now();
  double loss = 0;
  for (int64_t step = 0; step < c.sft.steps; ++step) {
    if (stop.load())
      return false;
    std::vector<kernels::sft_sample> batch;
    while (static_cast<int64_t>(batch.size()) < c.sft.batch_size) {
      auto item = source->next();
      if (!item) {
        source->restore(0);  // a finite dataset: another epoch
        continue;
      }
      if (item->worked_solution.empty() && c.task.kind == "jsonl")
        continue;  // an item without a demonstration (a truncated running sum is one: it stops at once)
      kernels::sft_sample s;
      s.prompt = m.tokenizer->encode(item->prompt);
      s.response = m.tokenizer->encode(item->worked_solution);
      s.response.push_back(m.eos);
      batch.push_back(std::move(s));
    }
    loss = sft.sft_update(batch).loss;
    auto elapsed = seconds_since(start);
    progress.show("warm start (SFT) step " + std::to_string(step + 1) + "/" + std::to_string(c.sft.steps) + " | loss " +
                  std::to_string(loss).substr(0, 6) + " | ETA " +
                  duration_text(elapsed / static_cast<double>(step + 1) * static_cast<double>(c.sft.steps - step - 1)));
  }
  progress.close();
  spdlog::info("warm start: {} SFT steps in {:.1f} s, final loss {:.4f}", c.sft.steps, seconds_since(start), loss);
  m.policy->set_trainable(false);
  return true;
}

std::shared_ptr<eval_set> make_eval_set(const run_config& c, const model_parts& m) {
  auto set = std::make_shared<eval_set>();
  for (auto& item : held_out_items(c)) {
    set->prompts.push_back(m.tokenizer->encode(item.prompt));
    set->tasks.push_back(item.task);
    set->difficulty.push_back(
        c.task.kind == "jsonl" ? 0 : static_cast<int64_t>(std::count(item.prompt.begin(), item.prompt.end(), '+')) + 1);
  }
  return set;
}

std::string by_difficulty_text(const eval_result& r) {
  std::string out;
  for (auto& [terms, counts] : r.by_difficulty)
    out += (out.empty() ? "" : ", ") + std::to_string(terms) + " terms " + std::to_string(counts.first) + "/" +
           std::to_string(counts.second);
  return out;
}

int64_t max_sequence(const model_parts& m) {
  return std::min<int64_t>(m.config.max_position_embeddings, 1024);
}

std::vector<rollout_actor> spawn_rollout_workers(caf::actor_system& sys, const run_config& c, const model_parts& m,
                                                 std::shared_ptr<compute_share> share, std::shared_ptr<tracer> trace,
                                                 int64_t initial_version, const std::string& prefix) {
  std::vector<rollout_actor> rollouts;
  for (int64_t i = 0; i < c.rl.rollout_workers; ++i) {
    auto copy = std::make_shared<kernels::policy_model>(m.config);
    copy->flat().copy_(m.policy->flat());
    rollout_setup rs;
    rs.name = prefix + std::to_string(i);
    rs.model = copy;
    rs.tokenizer = m.tokenizer;
    rs.engine = {c.rl.rollout_slots, max_sequence(m), 512, true};
    rs.initial_version = initial_version;
    rs.share = share;
    rs.trace = trace;
    rollouts.push_back(spawn_rollout(sys, rs));
  }
  return rollouts;
}

}  // namespace

rl_job_result run_rl_job(caf::actor_system& sys, const rl_job_options& options, const std::atomic<bool>& stop) {
  rl_job_result result;
  auto& c = options.config;
  auto& rl = c.rl;
  fs::create_directories(options.run_dir);
  auto checkpoint_dir = (options.run_dir / "checkpoint").string();
  progress_line progress{options.progress};
  at::set_num_threads(options.compute_threads);

  model_parts m;
  std::optional<controller_checkpoint> resume;
  std::string resume_from;
  eval_options eo;
  eo.max_new_tokens = rl.max_new_tokens;
  eo.stop_tokens = {};
  eo.scoring = make_reward_pool_config(c.reward).scoring;
  std::shared_ptr<eval_set> evals;
  try {
    m = make_model(c);
    eo.stop_tokens = {m.eos};
    eo.max_seq_len = max_sequence(m);
    evals = make_eval_set(c, m);
    if (options.resume) {
      resume_from = kernels::trainer::complete_checkpoint(checkpoint_dir);
      if (resume_from.empty())
        throw job_error("--resume: no checkpoint in " + checkpoint_dir + "; start the run without --resume");
      resume = controller_checkpoint::load(resume_from);
      auto saved = kernels::policy_model::load((fs::path{resume_from} / "model").string());
      if (saved.flat().numel() != m.policy->flat().numel())
        throw job_error(resume_from +
                        ": the checkpoint's model differs from the configured one; resume with the "
                        "configuration the run started with (" +
                        (options.run_dir / "config.toml").string() + ")");
      m.policy->flat().copy_(saved.flat());
      spdlog::info("resuming from {}: version {}, {} steps done, {} groups to generate again", resume_from,
                   resume->version, resume->steps, resume->requeue.size());
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    result.exit_code = 2;
    result.why = e.what();
    return result;
  }

  if (!resume && c.sft.steps > 0) {
    auto start = clock_type::now();
    if (!warm_start(c, m, stop, progress)) {
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
    auto r = evaluate_policy(*m.policy, *m.tokenizer, *evals, eo);
    result.accuracy_before = r.accuracy;
    spdlog::info("held-out greedy accuracy {} RL: {:.1f}% ({} prompts; {})", resume ? "at resume, during" : "before",
                 100 * r.accuracy, evals->prompts.size(), by_difficulty_text(r));
  }

  // The pipeline.
  auto trace = std::make_shared<tracer>("areal " + c.run.name);
  int actors = 2;  // rollout side and trainer side
  auto share = std::make_shared<compute_share>(options.compute_threads, options.share_cores || rl.synchronous, actors);
  bool multi_node = static_cast<bool>(options.node);
  std::vector<rollout_actor> rollouts;
  if (!multi_node || options.self.has(role::rollout))
    rollouts = spawn_rollout_workers(sys, c, m, share, trace, resume ? resume->version : 0, "rollout-");
  // Multi-node: the weights of each version go out through the publisher,
  // which starts with the current ones (for nodes that join).
  weight_publisher_actor publisher;
  if (multi_node) {
    weight_publisher_setup ps;
    ps.name = options.self.name;
    ps.backend = *parse_weight_backend(c.cluster.weight_transport);
    ps.host = options.self.host;
    ps.chunk_bytes = c.cluster.weight_chunk_bytes;
    ps.timeout = std::chrono::milliseconds(c.cluster.transfer_timeout_ms);
    publisher = spawn_weight_publisher(sys, ps);
    caf::scoped_actor boot{sys};
    local_weights initial{resume ? resume->version : 0, std::make_shared<const at::Tensor>(m.policy->flat().clone())};
    boot->request(publisher, caf::infinite, publish_atom::value, initial)
        .receive([](std::vector<weight_delivery>&) {}, [](caf::error&) {});
    for (size_t i = 0; i < rollouts.size(); ++i)
      boot->request(publisher, caf::infinite, subscribe_atom::value, "rollout-" + std::to_string(i),
                    caf::actor_cast<caf::actor>(rollouts[i]))
          .receive([](packed<weight_manifest>&, std::string&) {}, [](caf::error&) {});
  }
  trainer_setup ts;
  ts.model = m.policy;
  ts.config.optimizer.lr = rl.lr;
  ts.config.optimizer.warmup_steps = rl.warmup_steps;
  ts.config.optimizer.total_steps = rl.steps;
  ts.config.ppo.clip_low = rl.clip;
  ts.config.ppo.clip_high = rl.clip;
  ts.config.ppo.behaviour_cap = rl.behaviour_cap;
  ts.config.ppo.decoupled = rl.decoupled;
  ts.config.ppo_minibatches = rl.ppo_minibatches;
  ts.config.max_tokens_per_mb = rl.max_tokens_per_mb;
  ts.config.temperature = rl.temperature;
  ts.config.seed = stream_seed(c.run.seed, 6);
  ts.estimator = kernels::parse_estimator(rl.estimator);
  ts.initial_version = resume ? resume->version : 0;
  ts.resume_from = resume_from;
  ts.share = share;
  ts.trace = trace;
  auto trainer = spawn_trainer(sys, ts);
  auto reward_config = make_reward_pool_config(c.reward);
  reward_config.trace = trace;
  reward_pool_actor reward;
  if (!multi_node || options.self.has(role::reward))
    reward = spawn_reward_pool(sys, reward_config);
  evaluator_actor evaluator;
  if (c.eval.every > 0 && !evals->prompts.empty()) {
    evaluator_setup es;
    es.model = m.config;
    es.tokenizer = m.tokenizer;
    es.set = evals;
    es.options = eo;
    es.share = share;
    es.trace = trace;
    evaluator = spawn_evaluator(sys, es);
  }

  caf::scoped_actor self{sys};
  controller_setup cs;
  cs.source = training_source(c);
  cs.encode = [tokenizer = m.tokenizer](const std::string& text) { return tokenizer->encode(text); };
  cs.group_size = rl.group_size;
  cs.batch_size = rl.batch_size;
  cs.eta = rl.effective_eta();
  cs.max_concurrent = rl.max_concurrent;
  cs.rollout_slots = rl.rollout_slots;
  cs.total_steps = rl.steps;
  cs.sampling.temperature = static_cast<float>(rl.temperature);
  cs.sampling.max_new_tokens = static_cast<uint32_t>(rl.max_new_tokens);
  cs.sampling.stop_tokens = {m.eos};
  cs.seed = stream_seed(c.run.seed, 7);
  cs.rollouts = rollouts;
  cs.reward = reward;
  cs.trainer = trainer;
  cs.evaluator = evaluator;
  cs.eval_every = c.eval.every;
  cs.metrics_path = (options.run_dir / "metrics.jsonl").string();
  cs.checkpoint_dir = checkpoint_dir;
  cs.checkpoint_every = rl.checkpoint_every;
  cs.resume = resume;
  cs.trace = trace;
  cs.listener = caf::actor{self};
  cs.publisher = publisher;
  cs.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.cluster.request_timeout_s * 1000));
  cs.member_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.cluster.connect_timeout_s * 1000));
  spdlog::info("RL: {} mode, eta {}, {} steps of {} trajectories ({} prompts x {} samples), {} compute threads ({})",
               rl.synchronous ? "synchronous" : "asynchronous", rl.effective_eta(), rl.steps, rl.batch_size,
               rl.batch_size / rl.group_size, rl.group_size, options.compute_threads,
               options.share_cores || rl.synchronous ? "shared" : "static split");
  auto controller = spawn_controller(sys, std::move(cs));
  if (multi_node) {
    caf::anon_send(options.node, publisher_atom::value, caf::actor_cast<caf::actor>(controller),
                   caf::actor_cast<caf::actor>(publisher));
    spdlog::info("RL: taking rollout workers and reward pools from the other nodes as they join");
  }

  auto rl_start = clock_type::now();
  auto steps_at_start = resume ? resume->steps : 0;
  bool done = false, stop_sent = false;
  while (!done) {
    self->receive(
        [&](done_atom, int32_t code, std::string& why) {
          done = true;
          result.exit_code = code;
          result.why = why;
        },
        caf::after(std::chrono::milliseconds(250)) >>
            [&] {
              if (stop.load() && !stop_sent) {
                stop_sent = true;
                progress.close();
                spdlog::info("stopping at the next step boundary; a checkpoint will be written");
                self->send(controller, shutdown_atom::value, std::string{"stopped by a signal"});
              }
              self->request(controller, std::chrono::seconds(5), stats_atom::value)
                  .receive(
                      [&](controller_stats& s) {
                        auto elapsed = seconds_since(rl_start);
                        auto done_steps = s.steps - steps_at_start;
                        auto rate = done_steps > 0 ? elapsed / static_cast<double>(done_steps) : 0.0;
                        std::ostringstream os;
                        os.precision(3);
                        os << "RL step " << s.steps << "/" << rl.steps << " | "
                           << static_cast<double>(s.trained - (resume ? resume->trained : 0)) / std::max(elapsed, 1e-9)
                           << " samples/s | reward " << s.reward_mean_last << " | staleness <= " << s.max_staleness
                           << " | ETA "
                           << (done_steps > 0 ? duration_text(rate * static_cast<double>(rl.steps - s.steps)) : "?");
                        progress.show(os.str());
                      },
                      [](caf::error&) {});
            });
  }
  progress.close();
  result.rl_seconds = seconds_since(rl_start);
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
    self->request(trainer, std::chrono::seconds(60), weights_atom::value)
        .receive(
            [&](local_weights& w) {
              kernels::policy_model final_model(m.config);
              final_model.flat().copy_(*w.flat);
              auto r = evaluate_policy(final_model, *m.tokenizer, *evals, eo);
              result.accuracy_after = r.accuracy;
              spdlog::info("held-out greedy accuracy after RL (version {}): {:.1f}% ({})", w.version, 100 * r.accuracy,
                           by_difficulty_text(r));
              std::ofstream(options.run_dir / "metrics.jsonl", std::ios::app)
                  << nlohmann::json{{"event", "eval"},
                                    {"version", w.version},
                                    {"accuracy", r.accuracy},
                                    {"response_tokens_mean", r.mean_tokens},
                                    {"final", true}}
                         .dump()
                  << "\n";
            },
            [&](caf::error& e) { spdlog::warn("cannot fetch the final weights: {}", describe(e)); });
  }
  for (auto& r : rollouts)
    self->send_exit(r, caf::exit_reason::user_shutdown);
  self->send_exit(trainer, caf::exit_reason::user_shutdown);
  if (reward)
    self->send_exit(reward, caf::exit_reason::user_shutdown);
  if (publisher)
    self->send_exit(publisher, caf::exit_reason::user_shutdown);
  if (evaluator)
    self->send_exit(evaluator, caf::exit_reason::user_shutdown);
  self->send_exit(controller, caf::exit_reason::user_shutdown);

  if (multi_node) {
    // The other nodes' spans, in this node's wall clock: onto this timeline.
    self->request(options.node, std::chrono::seconds(15), trace_atom::value)
        .receive(
            [&](std::string& text) {
              auto to_trace_clock = trace_clock_to_wall_ns();
              size_t merged = 0;
              try {
                for (auto& s : nlohmann::json::parse(text)) {
                  trace->span(s.at(0).get<std::string>(), s.at(1).get<std::string>(),
                              s.at(2).get<int64_t>() - to_trace_clock, s.at(3).get<int64_t>() - to_trace_clock);
                  merged++;
                }
              } catch (const std::exception& e) {
                spdlog::warn("the other nodes' trace spans are unreadable: {}", e.what());
              }
              spdlog::info("trace: {} span(s) of the other nodes merged", merged);
            },
            [](caf::error& err) { spdlog::warn("cannot collect the other nodes' trace spans: {}", describe(err)); });
  }
  auto trace_path = (options.run_dir / "trace.json").string();
  if (!trace->write_chrome_trace(trace_path))
    spdlog::warn("cannot write {}", trace_path);
  auto& s = result.stats;
  nlohmann::json summary = {{"why", result.why},
                            {"exit_code", result.exit_code},
                            {"mode", rl.synchronous ? "sync" : "async"},
                            {"eta", rl.effective_eta()},
                            {"accuracy_before", result.accuracy_before},
                            {"accuracy_after", result.accuracy_after},
                            {"steps", s.steps},
                            {"version", s.version},
                            {"admitted", s.admitted},
                            {"trained", s.trained},
                            {"dropped", s.dropped},
                            {"max_staleness", s.max_staleness},
                            {"generated_tokens", s.generated_tokens},
                            {"trained_tokens", s.trained_tokens},
                            {"reward_scored", result.reward.scored},
                            {"reward_refused_while_full", result.reward.refused},
                            {"sft_seconds", result.sft_seconds},
                            {"rl_seconds", result.rl_seconds}};
  std::ofstream(options.run_dir / "summary.json") << summary.dump(2) << "\n";
  if (result.accuracy_before >= 0 && result.accuracy_after >= 0)
    spdlog::info("held-out accuracy: {:.1f}% before RL -> {:.1f}% after RL ({:+.1f} points); {} steps in {:.0f} s",
                 100 * result.accuracy_before, 100 * result.accuracy_after,
                 100 * (result.accuracy_after - result.accuracy_before), s.steps, result.rl_seconds);
  spdlog::info(
      "outputs in {}: metrics.jsonl, trace.json (open in https://ui.perfetto.dev), checkpoint/, sft_model/, "
      "summary.json",
      options.run_dir.string());
  return result;
}

rl_job_result run_rl_job(const rl_job_options& options, const std::atomic<bool>& stop) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg, options.config.cluster);
  caf::actor_system sys{cfg};
  return run_rl_job(sys, options, stop);
}

}  // namespace areal

namespace areal {

namespace {

struct members_state {
  static inline const char* name = "areal.node_members";
  std::string node;
  node_actor head;  // the controller node's node actor
  std::vector<rollout_actor> rollouts;
  uint64_t model_bytes = 0;
  std::string host;
  bool bulk = true;  // take the bulk link the publisher offers (Gloo, NCCL)
  std::chrono::milliseconds transfer_timeout{60000};
  caf::actor subscriber;
  bool rollouts_joined = false;
};

using members_pointer = caf::stateful_actor<members_state>*;

constexpr auto retry_interval = std::chrono::seconds(1);

// Hands one member to the run; the controller node answers not_ready until
// its job runs (the warm start comes first), so this asks again until then.
void join_run(members_pointer self, const std::string& role, const caf::actor& member) {
  self->request(self->state.head, std::chrono::seconds(10), join_atom::value, role, member)
      .then(
          [role](bool) {
            spdlog::info("{} joined the run", role == "rollout" ? "a rollout worker" : "the reward pool");
          },
          [self, role, member](caf::error& err) {
            if (err != node_errc::not_ready)
              spdlog::warn("joining the run failed ({}); trying again", describe(err));
            self->delayed_send(self, retry_interval, join_atom::value, role, member);
          });
}

void subscribe_to_weights(members_pointer self) {
  self->request(self->state.head, std::chrono::seconds(10), publisher_atom::value)
      .then(
          [self](caf::actor& publisher) {
            auto& st = self->state;
            weight_subscriber_setup ws;
            ws.node = st.node;
            ws.publisher = publisher;
            for (auto& r : st.rollouts)
              ws.sinks.push_back(caf::actor_cast<caf::actor>(r));
            ws.listener = caf::actor_cast<caf::actor>(self);
            ws.expected_bytes = st.model_bytes;
            ws.device_host = st.host;
            ws.allow_bulk = st.bulk;
            ws.timeout = st.transfer_timeout;
            st.subscriber = caf::actor_cast<caf::actor>(spawn_weight_subscriber(self->system(), ws));
            self->link_to(st.subscriber);
          },
          [self](caf::error& err) {
            if (err != node_errc::not_ready)
              spdlog::warn("asking for the weight publisher failed ({}); trying again", describe(err));
            self->delayed_send(self, retry_interval, publisher_atom::value);
          });
}

}  // namespace

caf::actor spawn_node_members(caf::actor_system& sys, const run_config& config, const node_spec& self_spec,
                              node_actor controller_node, std::shared_ptr<tracer> trace) {
  return sys.spawn<caf::detached>([config, self_spec, controller_node, trace](members_pointer self) -> caf::behavior {
    auto& st = self->state;
    st.node = self_spec.name;
    st.head = controller_node;
    st.host = self_spec.host;
    st.bulk = config.cluster.weight_transport != "caf";
    st.transfer_timeout = std::chrono::milliseconds(config.cluster.transfer_timeout_ms);
    if (self_spec.has(role::reward)) {
      auto pool_config = make_reward_pool_config(config.reward);
      pool_config.trace = trace;
      auto pool = spawn_reward_pool(self->system(), pool_config);
      self->link_to(pool);
      join_run(self, "reward", caf::actor_cast<caf::actor>(pool));
    }
    if (self_spec.has(role::rollout)) {
      try {
        auto threads = static_cast<int>(self_spec.compute_threads);
        at::set_num_threads(threads);
        auto m = make_model(config);
        st.model_bytes = static_cast<uint64_t>(m.policy->flat().nbytes());
        auto share = std::make_shared<compute_share>(threads, true, 1);
        st.rollouts = spawn_rollout_workers(self->system(), config, m, share, trace, 0, self_spec.name + "/rollout-");
        for (auto& r : st.rollouts)
          self->link_to(r);
        spdlog::info("{} rollout worker(s) ready ({} compute threads); waiting for the current weights",
                     st.rollouts.size(), threads);
        subscribe_to_weights(self);
      } catch (const std::exception& e) {
        spdlog::error("cannot start the rollout workers: {}", e.what());
        self->quit(caf::make_error(caf::sec::runtime_error, e.what()));
        return {};
      }
    }
    return {
        [self](join_atom, std::string& role, caf::actor& member) { join_run(self, role, member); },
        [self](publisher_atom) { subscribe_to_weights(self); },
        [self](weights_atom, int64_t version, std::string& error) {
          auto& s = self->state;
          if (!error.empty()) {
            if (!s.rollouts_joined) {
              spdlog::error("the rollout workers cannot take the run's weights: {}", error);
              self->quit(caf::make_error(weight_errc::size_mismatch, error));
            }
            return;
          }
          if (s.rollouts_joined)
            return;
          s.rollouts_joined = true;
          spdlog::info("received the run's weights (version {}); the rollout workers join", version);
          for (auto& r : s.rollouts)
            join_run(self, "rollout", caf::actor_cast<caf::actor>(r));
        },
    };
  });
}

}  // namespace areal
