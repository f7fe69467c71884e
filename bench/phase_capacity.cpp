// The phases' capacities (phase_capacity.hpp).
#include "phase_capacity.hpp"

#include <algorithm>
#include <atomic>
#include <iomanip>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "bench_common.hpp"

#include "areal/actors/run_kernels.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/device.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/tasks/tasks.hpp"

namespace areal::bench {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

// The warm-started model as the job makes it: float32 master weights on
// model.device, products in model.dtype.
kernels::policy_model load_as_the_job(const fs::path& model_dir, const run_config& c) {
  auto model = kernels::policy_model::load(model_dir.string(), kernels::tensor_options(c.model.device, "float32"));
  model.set_compute_dtype(c.model.dtype);
  return model;
}

// How long each capacity is measured at least. Over 3 updates (about 0.3 s)
// T on 2 threads was 3,080 / 3,330 / 3,690 tokens/s in three full runs back to
// back on the development VM, and in the first the job's own training steps
// ran at 1.02-1.08 of it: the bound moved with each short measurement.
double measured_seconds(bool quick) {
  return quick ? 0.25 : 1.5;
}

// The job's engine (slots, prompt pool, interruption) and sampling on the
// warm-started model (run_kernels.hpp), fed as the controller feeds it: groups
// of group_size samples of one prompt.
struct generation_side {
  run_config c;
  kernels::tokenizer tok;
  int32_t eos;
  kernels::policy_model model;
  kernels::generation_engine engine;
  std::unique_ptr<tasks::task_source> source;
  std::vector<int32_t> prompt;
  uint64_t next = 0;

  generation_side(const fs::path& model_dir, const workload& w, int threads)
      : c(make_config(w, threads, {})),
        tok(kernels::tokenizer::load((model_dir / "tokenizer.json").string())),
        eos(*tok.token_id("<eos>")),
        model(load_as_the_job(model_dir, c)),
        engine(model, rollout_engine_config(c, model.config())) {
    tasks::running_sum_options o;
    o.seed = 77;
    o.max_value = static_cast<int>(w.max_value);
    o.median_terms = w.median_terms;
    o.max_terms = static_cast<int>(w.max_terms);
    source = tasks::running_sum_generator(o);
  }
  // Submits requests until `queued` wait beyond the running batch.
  void fill(int64_t queued) {
    while (static_cast<int64_t>(engine.queued()) < queued) {
      if (next % static_cast<uint64_t>(c.rl.group_size) == 0)
        prompt = tok.encode(source->next()->prompt);
      kernels::generation_job job;
      job.id = next;
      job.prompt = prompt;
      job.sampling = rollout_sampling(c, eos);
      job.seed = next++;
      engine.submit(std::move(job));
    }
  }
};

// The trainer the job runs on `replicas` cores (one data-parallel replica per
// thread), with a representative batch of the engine's trajectories: whole
// groups (group_size samples of one prompt), as the job's batches are (its
// trainer computes a group's prompt once), chosen in random order (the first
// to finish are the shortest).
struct training_side {
  kernels::policy_model model;
  kernels::trainer trainer;
  std::vector<kernels::rl_sample> batch;

  training_side(const fs::path& model_dir, const run_config& c, int replicas,
                std::vector<kernels::generation_output> outputs, int64_t batch_size)
      : model(load_as_the_job(model_dir, c)), trainer(model, trainer_config(c, replicas)) {
    std::mt19937 rng{3};
    auto group_size = static_cast<uint64_t>(std::max<int64_t>(1, c.rl.group_size));
    std::map<uint64_t, std::vector<const kernels::generation_output*>> groups;  // generation_side's ids
    for (auto& out : outputs)
      if (!out.tokens.empty())
        groups[out.id / group_size].push_back(&out);
    std::vector<std::vector<const kernels::generation_output*>> whole;
    for (auto& [id, members] : groups)
      if (members.size() == group_size)
        whole.push_back(members);
    std::shuffle(whole.begin(), whole.end(), rng);
    for (auto& members : whole)
      for (auto* out : members)
        if (static_cast<int64_t>(batch.size()) < batch_size)
          batch.push_back(training_sample(*out, rng));
  }
  static kernels::trainer_config trainer_config(const run_config& c, int replicas) {
    auto tc = rl_trainer_config(c);
    tc.data_parallel = replicas;
    return tc;
  }
  // Trained tokens of one PPO update.
  int64_t update() { return trainer.ppo_update(batch).tokens; }
  // Trained tokens/s over updates of the batch: at least 3 (1 with --quick), for
  // at least measured_seconds.
  double rate(bool quick) {
    int64_t tokens = 0;
    auto start = clock_type::now();
    for (int done = 0; done < (quick ? 1 : 3) || seconds_since(start) < measured_seconds(quick); ++done)
      tokens += update();
    return static_cast<double>(tokens) / seconds_since(start);
  }
};

}  // namespace

capacity measure_capacity(const fs::path& model_dir, const workload& w, int threads, bool quick,
                          std::vector<kernels::generation_output>& outputs) {
  kernels::set_compute_threads(threads);
  generation_side gen(model_dir, w, threads);
  gen.fill(gen.c.rl.rollout_slots);
  // Generation with the batch kept full (requests always queued), after the
  // first step (the batch's prefill and the weights' packing, once).
  outputs.clear();
  for (auto& out : gen.engine.step())
    outputs.push_back(std::move(out));
  auto start = clock_type::now();
  auto tokens_before = gen.engine.counters().decode_tokens;
  do {
    gen.fill(gen.c.rl.rollout_slots);
    for (auto& out : gen.engine.step())
      outputs.push_back(std::move(out));
  } while (seconds_since(start) < measured_seconds(quick));
  capacity cap;
  cap.generation = static_cast<double>(gen.engine.counters().decode_tokens - tokens_before) / seconds_since(start);
  for (auto& out : gen.engine.run_to_completion())
    outputs.push_back(std::move(out));

  training_side train(model_dir, gen.c, threads, outputs, w.batch_size);
  train.update();  // warm-up
  cap.training = train.rate(quick);
  return cap;
}

capacity measure_together(const fs::path& model_dir, const workload& w, int generation_threads, int replicas,
                          bool quick, const std::vector<kernels::generation_output>& outputs) {
  generation_side gen(model_dir, w, generation_threads);
  training_side train(model_dir, gen.c, replicas, outputs, w.batch_size);
  // The trainer's thread on `replicas` threads, as the job's trainer actor sets
  // it (one replica runs its products on the calling thread's threads).
  kernels::set_compute_threads(replicas);
  train.update();  // warm-up, alone
  std::atomic<bool> stop{false}, started{false};
  int64_t generated = 0;
  double generation_seconds = 0;
  std::thread generating([&] {
    kernels::set_compute_threads(generation_threads);
    gen.fill(gen.c.rl.rollout_slots);
    gen.engine.step();  // the batch's prefill and the weights' packing, before the clock (as alone)
    started = true;
    auto begin = clock_type::now();
    auto before = gen.engine.counters().decode_tokens;
    while (!stop) {
      gen.fill(gen.c.rl.rollout_slots);  // a full batch all along
      gen.engine.step();
    }
    generated = gen.engine.counters().decode_tokens - before;
    generation_seconds = seconds_since(begin);
    kernels::release_compute_threads();
  });
  while (!started)
    std::this_thread::yield();
  // The trainer's own thread on `replicas` threads, as the job's trainer actor
  // sets it (one replica runs its products on the calling thread's threads).
  capacity cap;
  cap.training = train.rate(quick);
  stop = true;
  generating.join();
  cap.generation = static_cast<double>(generated) / generation_seconds;
  return cap;
}

double best_mix(const std::vector<configuration>& configs, std::string& how) {
  double bound = 0;
  for (auto& a : configs)
    if (a.generation >= a.training && a.training > bound) {
      bound = a.training;
      how = a.name + " all the time";
    }
  for (auto& a : configs)
    for (auto& b : configs)
      if (a.generation > a.training && b.training > b.generation) {
        // Time x in a, 1 - x in b, with generated = trained tokens.
        double x = (b.training - b.generation) / ((a.generation - a.training) + (b.training - b.generation));
        double rate = x * a.training + (1 - x) * b.training;
        if (rate > bound) {
          bound = rate;
          std::ostringstream mix;
          mix << std::setprecision(2) << x << " of the time " << a.name << ", " << 1 - x << " " << b.name;
          how = mix.str();
        }
      }
  return bound;
}

bound_measurement measure_bound(const fs::path& model_dir, const workload& w, int threads, bool quick,
                                std::vector<kernels::generation_output>& outputs, std::ostream* log) {
  bound_measurement m;
  m.caps.resize(static_cast<size_t>(threads + 1));
  for (int k = 1; k <= threads; ++k) {
    m.caps[static_cast<size_t>(k)] = measure_capacity(model_dir, w, k, quick, outputs);
    if (log)
      *log << "capacity at " << k << " thread(s): generation G = " << m.caps[static_cast<size_t>(k)].generation
           << " tokens/s, training T = " << m.caps[static_cast<size_t>(k)].training << " tokens/s" << std::endl;
  }
  auto& all = m.caps[static_cast<size_t>(threads)];
  std::vector<configuration> alone = {{"generation alone on " + std::to_string(threads), all.generation, 0},
                                      {"training alone on " + std::to_string(threads), 0, all.training}};
  auto assumed = alone;
  m.configurations = alone;
  // On a GPU both phases share the device whatever the threads: measured at once there too.
  auto device = make_config(w, threads, {}).model.device;
  if (threads > 1 || device != "cpu") {
    int shared_generation = std::max(1, threads / 2);
    auto both = measure_together(model_dir, w, shared_generation, threads, quick, outputs);
    auto where = device == "cpu" ? std::string{"shared cores"} : "one " + device + " device";
    m.configurations.push_back({"generation on " + std::to_string(shared_generation) + " and training on " +
                                    std::to_string(threads) + " at once (" + where + ")",
                                both.generation, both.training});
    if (log)
      *log << "measured at once on " << where << " (generation " << shared_generation << " thread(s), training "
           << threads << " replicas): G = " << both.generation << " tokens/s, T = " << both.training << " tokens/s"
           << std::endl;
  }
  for (int k = 1; k < threads; ++k) {
    auto both = measure_together(model_dir, w, k, threads - k, quick, outputs);
    auto name = "generation on " + std::to_string(k) + " and training on " + std::to_string(threads - k);
    m.configurations.push_back({name + " at once", both.generation, both.training});
    assumed.push_back(
        {name, m.caps[static_cast<size_t>(k)].generation, m.caps[static_cast<size_t>(threads - k)].training});
    if (log)
      *log << "measured at once on split cores (generation " << k << ", training " << threads - k
           << "): G = " << both.generation << " tokens/s, T = " << both.training << " tokens/s" << std::endl;
  }
  m.bound = best_mix(m.configurations, m.bound_how);
  m.assumed_bound = best_mix(assumed, m.assumed_how);
  m.alternating = 1.0 / (1.0 / all.generation + 1.0 / all.training);
  return m;
}

bound_measurement bracket(const bound_measurement& a, const bound_measurement& b) {
  auto m = a;
  for (size_t k = 0; k < m.caps.size() && k < b.caps.size(); ++k) {
    m.caps[k].generation = (a.caps[k].generation + b.caps[k].generation) / 2;
    m.caps[k].training = (a.caps[k].training + b.caps[k].training) / 2;
  }
  for (size_t i = 0; i < m.configurations.size() && i < b.configurations.size(); ++i) {
    m.configurations[i].generation = (a.configurations[i].generation + b.configurations[i].generation) / 2;
    m.configurations[i].training = (a.configurations[i].training + b.configurations[i].training) / 2;
  }
  m.bound = (a.bound + b.bound) / 2;
  m.assumed_bound = (a.assumed_bound + b.assumed_bound) / 2;
  m.alternating = (a.alternating + b.alternating) / 2;
  return m;
}

}  // namespace areal::bench
