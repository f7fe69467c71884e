// This machine's costs for the simulator (see cpu_costs.hpp).
#include "cpu_costs.hpp"
#include "bench_common.hpp"

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "areal/actors/run_kernels.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/engine.hpp"
#include "areal/kernels/model.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/tasks/tasks.hpp"

namespace areal::bench {
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

struct parts {
  kernels::tokenizer tok;
  int32_t eos = 0;
  run_config config;
  std::unique_ptr<tasks::task_source> prompts;
};

parts load_parts(const fs::path& model_dir, const workload& w, int threads) {
  auto tok = kernels::tokenizer::load((model_dir / "tokenizer.json").string());
  auto eos = *tok.token_id("<eos>");
  auto config = make_config(w, threads, {});
  tasks::running_sum_options o;
  o.seed = 91;
  o.max_value = static_cast<int>(w.max_value);
  o.median_terms = w.median_terms;
  o.max_terms = static_cast<int>(w.max_terms);
  return {std::move(tok), eos, std::move(config), tasks::running_sum_generator(o)};
}

kernels::generation_job make_job(parts& p, uint64_t id, bool stop_at_eos, int64_t max_new) {
  kernels::generation_job job;
  job.id = id;
  job.prompt = p.tok.encode(p.prompts->next()->prompt);
  job.sampling.max_new_tokens = static_cast<uint32_t>(max_new);
  if (stop_at_eos)
    job.sampling.stop_tokens = {p.eos};
  job.seed = id;
  return job;
}

// The trainer as the job configures it (run_kernels.hpp), `replicas` data-parallel replicas.
kernels::trainer_config trainer_config_of(const run_config& c, int replicas) {
  auto tc = rl_trainer_config(c);
  tc.data_parallel = replicas;
  return tc;
}

// Decode steps as the job's engine runs them: batches of the workload's groups
// (one prompt, group_size answers) that stop at the end token or the cap, so
// that each batch thins out as its answers end. Rows (1, sequences, context
// tokens) -> seconds, for every step after the first; the first step of a
// batch also prefills its prompts: rows (prompt tokens, attended) -> its
// seconds beyond the decode step that follows it.
struct decode_points {
  std::vector<std::vector<double>> steps, prefills;
  std::vector<double> step_s, prefill_s;
};

decode_points time_decode(kernels::policy_model& model, parts& p, int threads, bool quick) {
  kernels::set_compute_threads(threads);
  decode_points d;
  auto cap = p.config.rl.max_new_tokens;
  auto group = p.config.rl.group_size;
  uint64_t id = 0;
  for (int repeat = 0; repeat < (quick ? 2 : 4); ++repeat)
    for (int64_t batch : {group, 4 * group, p.config.rl.rollout_slots}) {
      kernels::generation_engine engine(model, rollout_engine_config(p.config, model.config()));
      double prompt_tokens = 0, attended = 0;
      for (int64_t g = 0; g < batch / group; ++g) {
        auto prompt = make_job(p, id, true, cap).prompt;
        for (int64_t i = 0; i < group; ++i) {
          auto job = make_job(p, id++, true, cap);
          job.prompt = prompt;
          double n = double(prompt.size());
          prompt_tokens += n;
          attended += 0.5 * n * (n + 1);
          engine.submit(std::move(job));
        }
      }
      double first = -1;
      bool prefill_counted = false;
      while (!engine.idle()) {
        double sequences = double(engine.running() + engine.queued()), context = 0;
        for (auto& o : engine.in_flight())
          context += double(o.prompt.size() + o.tokens.size());
        auto start = clock_type::now();
        engine.step();
        double seconds = since(start);
        if (first < 0) {
          first = seconds;
          continue;
        }
        if (!prefill_counted) {  // the first step less the decode step after it
          prefill_counted = true;
          d.prefills.push_back({prompt_tokens, attended});
          d.prefill_s.push_back(std::max(0.0, first - seconds));
        }
        d.steps.push_back({1.0, sequences, context});
        d.step_s.push_back(seconds);
      }
    }
  return d;
}

// A batch the trainer trains on, as the job's batches are: groups of
// group_size answers to one prompt (the trainer computes a group's prompt once
// in a step), the groups in random order, so that the first quarter or half of
// it is whole groups too. With a prompt of its own for every answer, the
// steps computed 1.8x the tokens of the job's at the same batch size and the
// fitted training costs came out twice the job's own (bench_simulate (f)).
std::vector<kernels::rl_sample> training_batch(kernels::policy_model& model, parts& p, int64_t size) {
  kernels::generation_engine engine(model, rollout_engine_config(p.config, model.config()));
  auto group = std::max<int64_t>(1, p.config.rl.group_size);
  auto groups = std::max<int64_t>(1, size / group);
  const uint64_t first_id = 100000;
  uint64_t id = first_id;
  for (int64_t g = 0; g < groups; ++g) {
    auto prompt = make_job(p, id, true, p.config.rl.max_new_tokens).prompt;
    for (int64_t i = 0; i < group; ++i) {
      auto job = make_job(p, id++, true, p.config.rl.max_new_tokens);
      job.prompt = prompt;
      engine.submit(std::move(job));
    }
  }
  std::vector<std::vector<kernels::generation_output>> order(static_cast<size_t>(groups));  // by group
  for (auto& out : engine.run_to_completion())
    if (!out.tokens.empty())
      order[(out.id - first_id) / static_cast<uint64_t>(group)].push_back(std::move(out));
  std::mt19937 rng{5};
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<kernels::rl_sample> batch;
  for (auto& members : order)
    for (auto& out : members)
      batch.push_back(training_sample(out, rng));
  return batch;
}

// PPO steps on batches of several sizes: rows (1, tokens, attended) -> seconds.
struct train_points {
  std::vector<std::vector<double>> rows;
  std::vector<double> seconds;
};

train_points time_training(kernels::trainer& trainer, const std::vector<kernels::rl_sample>& all, int64_t batch,
                           bool quick) {
  train_points t;
  for (auto size : {batch / 4, batch / 2, batch}) {
    std::vector<kernels::rl_sample> b(all.begin(), all.begin() + std::min<int64_t>(size, int64_t(all.size())));
    double tokens = 0, attended = 0;
    for (auto& s : b) {
      double n = double(s.prompt.size() + s.response.size());
      tokens += n;
      attended += 0.5 * n * (n + 1);
    }
    for (int i = 0; i < (quick ? 2 : 4); ++i) {
      auto start = clock_type::now();
      trainer.ppo_update(b);
      t.rows.push_back({1.0, tokens, attended});
      t.seconds.push_back(since(start));
    }
  }
  return t;
}

// Runs `work` on a thread of its own until the measurement is done.
class beside {
 public:
  template <class F>
  explicit beside(F work)
      : thread_([this, work]() mutable {
          while (!stop_)
            work();
        }) {}
  ~beside() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

sim::measured_rates fit(const decode_points& d, const train_points& t, double transfer, const std::string& source) {
  sim::measured_rates r;
  auto decode = sim::fit_nonnegative(d.steps, d.step_s);
  r.decode_base = decode[0];
  r.decode_per_sequence = decode[1];
  r.decode_per_context = decode[2];
  auto prefill = sim::fit_nonnegative(d.prefills, d.prefill_s);
  r.prefill_per_token = prefill[0];
  r.prefill_per_attended = prefill[1];
  auto train = sim::fit_nonnegative(t.rows, t.seconds);
  r.train_base = train[0];
  r.train_per_token = train[1];
  r.train_per_attended = train[2];
  r.transfer = transfer;
  r.source = source;
  return r;
}

}  // namespace

cpu_rates measure_cpu_rates(const fs::path& model_dir, const workload& w, int threads, bool quick) {
  auto p = load_parts(model_dir, w, threads);
  // Separate copies: the trainer changes its model's weights while the engine reads its own.
  auto engine_model = kernels::policy_model::load(model_dir.string());
  auto trainer_model = kernels::policy_model::load(model_dir.string());
  auto all = training_batch(engine_model, p, w.batch_size);
  kernels::trainer trainer(trainer_model, trainer_config_of(p.config, threads));
  trainer.ppo_update(all);  // warm-up

  // The weights' way to the rollout worker in one process: a snapshot of the flat buffer.
  auto start = clock_type::now();
  for (int i = 0; i < 10; ++i)
    (void)trainer_model.flat().clone();
  double transfer = since(start) / 10;

  cpu_rates out;
  auto how =
      fmt::format("{} decode steps at batch 1-{} and PPO steps of {}-{} samples on the warm-started model",
                  quick ? "one pass of" : "two passes of", p.config.rl.rollout_slots, w.batch_size / 4, w.batch_size);
  {
    auto decode = time_decode(engine_model, p, threads, quick);
    auto train = time_training(trainer, all, w.batch_size, quick);
    out.alone = fit(decode, train, transfer,
                    how + fmt::format(", each alone on {} thread(s) (the engine's intra-op threads, the trainer's "
                                      "replicas)",
                                      threads));
  }
  // Both at once, as the job's compute_share runs them: the engine on its split
  // share of the threads, the trainer's replicas on every core beside it.
  int split = std::max(1, threads / 2);
  decode_points decode;
  {
    beside training([&] { trainer.ppo_update(all); });
    decode = time_decode(engine_model, p, split, quick);
  }
  train_points train;
  {
    auto background = load_parts(model_dir, w, threads);  // prompts of its own stream
    kernels::generation_engine engine(engine_model, rollout_engine_config(p.config, engine_model.config()));
    uint64_t id = 1u << 30;
    beside generating([&] {
      kernels::set_compute_threads(split);
      while (engine.queued() + engine.running() < static_cast<size_t>(p.config.rl.rollout_slots))
        engine.submit(make_job(background, id++, true, p.config.rl.max_new_tokens));
      engine.step();
    });
    train = time_training(trainer, all, w.batch_size, quick);
  }
  out.shared = fit(decode, train, transfer,
                   how + fmt::format(", the engine on {} thread(s) while the trainer's {} replica(s) train and the "
                                     "trainer while the engine decodes",
                                     split, threads));
  return out;
}

}  // namespace areal::bench
