// bench_simulate's validation on this machine (see sim_validation.hpp).
//
// Two cost models predict the same real rows:
//  - isolated: the engine's and the trainer's steps timed on their own
//    (cpu_costs.cpp), alone and while the other computes;
//  - in the job: the same, scaled by how much slower the job's own steps ran
//    in a separate synchronous calibration run (another seed) than the
//    isolated model says they should: its trace's generate and train time
//    against a simulation of that run with the isolated costs.
// The rows predicted are other runs than the calibration run. For each row
// it also prints where the time went: the RL phase, and the engine's and the
// trainer's busy time from the run's trace, beside the simulation's.
#include "sim_validation.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <fmt/format.h>

#include "areal/runtime/report.hpp"
#include "areal/sim/replay.hpp"
#include "areal/sim/simulation.hpp"
#include "bench_jobs.hpp"
#include "cpu_costs.hpp"
#include "node_process.hpp"  // tests/: areal as a child process, its log, bounded waits

namespace areal::bench {
namespace fs = std::filesystem;

namespace {

struct row {
  std::string name;
  int64_t eta;                                                     // 0: synchronous
  double measured = 0;                                             // trained response tokens/s over the RL phase
  double rl_seconds = 0, generate_seconds = 0, train_seconds = 0;  // the phase, and its trace's busy time
  double replayed = 0;  // the rate of its replay with the costs fitted to its own trace
  double engine_r2 = 0, trainer_r2 = 0;
};

// What a synchronous run of the workload generated: the mean prompt and the response lengths.
sim::workload workload_of(const fs::path& trajectories, const run_config& c) {
  std::ifstream in(trajectories);
  std::string line;
  double sum = 0, n = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("prompt_tokens") && j["prompt_tokens"].is_array()) {
      sum += double(j["prompt_tokens"].size());
      n += 1;
    }
  }
  sim::workload work;
  work.prompt_tokens = std::max<int64_t>(1, std::llround(n > 0 ? sum / n : 1));
  work.max_new_tokens = c.rl.max_new_tokens;
  work.length_table = sim::read_length_table(trajectories.string());
  work.length_source = trajectories.filename().string() + " of a synchronous run";
  work.reward_workers = c.reward.workers;
  work.reward_median_s = 50e-6;  // assumption: checking a running sum's answer takes tens of microseconds
  return work;
}

// A row of the workload in virtual time. One node: its engine and trainer share
// the cores as the cost model's shared rates say. Several one-thread processes
// (engines > 1): `shared_cores` cores shared by all of them.
sim::sim_result simulate_row(std::shared_ptr<const sim::cost_model> costs, const sim::workload& work,
                             const run_config& c, int64_t eta, int64_t engines = 1, int64_t shared_cores = 0) {
  sim::sim_setup s;
  s.costs = std::move(costs);
  s.work = work;
  s.colocated = eta == 0;
  s.devices = eta == 0 ? 1 : engines + 1;  // async: the engines and the trainer
  s.generation_share = double(engines) / double(engines + 1);
  s.shared_cores = shared_cores;
  s.eta = eta;
  s.batch_prompts = c.rl.batch_size / c.rl.group_size;
  s.group_size = c.rl.group_size;
  s.steps = c.rl.steps;
  s.engine_slots = c.rl.rollout_slots;
  s.max_concurrent = c.rl.max_concurrent;
  s.keep_log = false;
  auto r = sim::simulate(s);
  if (r.exit_code != 0 || r.steps != s.steps)
    throw std::runtime_error("a simulated row ended early: " + r.end_reason);
  return r;
}

// Response tokens per second, as the job counts its trained tokens.
double response_rate(const sim::sim_result& r) {
  return double(r.trained_response_tokens) / r.virtual_seconds;
}

// The same from the first step's end to the last's: the pipeline's fill (and
// in a real run the processes' start-up) left out.
double response_rate_after_first_step(const sim::sim_result& r, int64_t prompt_tokens) {
  if (r.trained.size() < 2)
    return 0;
  double tokens = 0;
  for (size_t i = 1; i < r.trained.size(); ++i)
    tokens += double(r.trained[i].tokens - r.trained[i].samples * prompt_tokens);
  return tokens / (r.trained.back().seconds - r.trained.front().seconds);
}

// A finished run replayed in virtual time with the costs fitted to its own
// trace (areal simulate --replay): its rate of trained response tokens.
double replay_rate(const fs::path& dir, row& r) {
  auto loaded = load_config((dir / "config.toml").string());
  if (!loaded.config)
    throw std::runtime_error(dir.string() + "/config.toml: " + loaded.errors.front());
  auto recorded = sim::read_recorded_run(dir, *loaded.config);
  auto setup = sim::replay_setup(recorded, *loaded.config);
  setup.keep_log = false;
  auto simulated = sim::simulate(setup);
  if (simulated.exit_code != 0 || simulated.steps != setup.steps)
    throw std::runtime_error("the replay of " + dir.string() + " ended early: " + simulated.end_reason);
  r.engine_r2 = recorded.costs.engine.r2;
  r.trainer_r2 = recorded.costs.trainer.r2;
  return response_rate(simulated);
}

// Seconds a finished run spent generating (its rollout tracks) and training (the trainer's track),
// from its trace as the report reads it.
std::pair<double, double> busy_seconds(const fs::path& run_dir) {
  auto run = nlohmann::json::parse(report::read_run_json(run_dir));
  if (run["timeline"].is_null())
    throw std::runtime_error(run_dir.string() + ": the run left no trace");
  double generate = 0, train = 0;
  for (auto& [track, kinds] : run["timeline"]["tracks"].items()) {
    if (track.find("rollout") != std::string::npos)  // "rollout-0", or "gen-a/rollout-0" of another node
      generate += kinds.value("generate", 0.0);
    if (track == "trainer")
      train += kinds.value("train", 0.0);
  }
  return {generate, train};
}

sim::measured_rates scaled(sim::measured_rates r, double generate, double train, const std::string& how) {
  for (auto* x :
       {&r.decode_base, &r.decode_per_sequence, &r.decode_per_context, &r.prefill_per_token, &r.prefill_per_attended})
    *x *= generate;
  for (auto* x : {&r.train_base, &r.train_per_token, &r.train_per_attended})
    *x *= train;
  r.source += how;
  return r;
}

// The four-process run: configs/four_nodes.toml's topology with the rows'
// workload, each node an `areal` process, as a user starts them.
struct four_process_run {
  fs::path dir;
  run_config config;           // its resolved configuration
  sim::recorded_run recorded;  // its metrics and the costs fitted to its trace
  double measured = 0;         // trained response tokens/s over the RL phase (its metrics)
  double rl_seconds = 0;
  double first_step_s = 0;  // when the first step ended
  double after_first = 0;   // trained response tokens/s from the first step's end to the last's
  double per_sample = 0;    // response tokens per trained sample
};

four_process_run run_four_processes(const workload& w, const std::vector<std::string>& overrides,
                                    const fs::path& scratch, const std::string& name) {
  auto base = scratch / name;
  fs::remove_all(base);
  fs::create_directories(base);
  auto config = base / "four.toml";
  std::ofstream(config) << four_process_config(w, test::free_ports(4));
  std::vector<std::string> sets = w.extra;
  sets.insert(sets.end(), overrides.begin(), overrides.end());
  sets.push_back("run.output_dir=\"" + base.string() + "\"");
  std::vector<std::unique_ptr<test::node_process>> nodes;
  for (std::string node : {"head", "scorer", "gen-a", "gen-b"}) {
    std::vector<std::string> args{"--config", config.string(), "--node", node};
    for (auto& o : sets)
      args.insert(args.end(), {"--set", o});
    nodes.push_back(std::make_unique<test::node_process>(args, base / (node + ".log"), base));
    if (!nodes.back()->started())
      throw std::runtime_error("could not start " + std::string(AREAL_BINARY));
  }
  auto head = nodes.front()->wait_exit(std::chrono::minutes(20));
  if (head != 0)
    throw std::runtime_error(
        "the four-process run's head " +
        (head ? "exited with " + std::to_string(*head) : std::string("did not end in 20 minutes")) + ": " +
        nodes.front()->log());
  for (auto& n : nodes)
    n->wait_exit(std::chrono::seconds(30));  // the others stop when the head does; killed if not
  four_process_run run;
  run.dir = base / "bench";  // run.output_dir / run.name
  auto loaded = load_config((run.dir / "config.toml").string());
  if (!loaded.config)
    throw std::runtime_error(run.dir.string() + "/config.toml: " + loaded.errors.front());
  run.config = *loaded.config;
  run.recorded = sim::read_recorded_run(run.dir, run.config);
  auto& recorded = run.recorded;
  double tokens = 0, samples = 0;
  for (auto& step : recorded.steps) {
    tokens += double(step.response_tokens);
    samples += double(step.samples);
  }
  run.per_sample = samples > 0 ? tokens / samples : 0;
  run.rl_seconds = recorded.steps.empty() ? 0 : recorded.steps.back().seconds;
  run.measured = run.rl_seconds > 0 ? tokens / run.rl_seconds : 0;
  if (recorded.steps.size() >= 2) {
    run.first_step_s = recorded.steps.front().seconds;
    run.after_first = (tokens - double(recorded.steps.front().response_tokens)) / (run.rl_seconds - run.first_step_s);
  }
  return run;
}

// The four-process run (configs/four_nodes.toml's topology, the workload at eta
// 2): two one-thread engines and a one-thread trainer, each a process, on this
// machine's cores, and its predictions: the simulator with the three processes
// sharing the cores (sim_setup::shared_cores), with costs
//  - isolated: the engine's and the trainer's steps timed on one thread, alone
//    and while the other computes;
//  - calibrated: fitted to the trace of the same four processes in synchronous
//    mode (another seed), whose engines and trainer never compute at once: the
//    processes' own step costs, messaging and all, without their contention.
// Both with the response lengths that calibration run generated.
// Text for the report, and its JSON.
struct four_validation {
  std::string text;
  nlohmann::json json;
};

four_validation validate_four_processes(const workload& w, const run_config& base, const fs::path& model_dir,
                                        int threads, bool quick, const fs::path& scratch) {
  constexpr int64_t eta = 2;
  std::vector<std::string> sets{"model.path=\"" + model_dir.string() + "\"", "sft.steps=0"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), sets.begin(), sets.end());
    return more;
  };
  auto one_thread = measure_cpu_rates(model_dir, w, 1, quick);
  auto calibration = run_four_processes(w, with({"rl.mode=\"sync\"", "run.seed=2", "rl.record_trajectories=true"}),
                                        scratch, "four-calibration");
  auto run = run_four_processes(w, with({"rl.eta=" + std::to_string(eta)}), scratch, "four");
  row measured{"4 processes", eta};
  measured.replayed = replay_rate(run.dir, measured);
  std::tie(measured.generate_seconds, measured.train_seconds) = busy_seconds(run.dir);
  // The processes' start-up (loading, the engines' KV caches, joining, first steps' warm-up), which the
  // simulation has not: how much later the calibration run's first step ended than its own replay's.
  auto calibration_setup = sim::replay_setup(calibration.recorded, calibration.config);
  calibration_setup.keep_log = false;
  auto calibration_replayed = sim::simulate(calibration_setup);
  if (calibration_replayed.trained.empty())
    throw std::runtime_error("the replay of the four-process calibration run trained no step");
  double start_up = std::max(0.0, calibration.first_step_s - calibration_replayed.trained.front().seconds);
  // The lengths the calibration run generated (the same processes, another seed).
  auto work = workload_of(calibration.dir / "trajectories.jsonl", base);

  four_validation v;
  v.text = fmt::format(
      "four processes (head: controller + trainer; scorer; gen-a and gen-b; one compute thread each, Gloo weights, "
      "loopback; eta {}, {} steps), the three computing ones sharing {} cores:\n"
      "  measured {:.0f} tok/s over {:.2f} s, {:.0f} from the first step's end ({:.2f} s) on; replayed from its own "
      "trace {:.0f} ({:+.1f}%, fit R^2 {:.2f}/{:.2f})\n"
      "  {:<11} {:>10} {:>8} {:>14} {:>8} {:>8} {:>8} {:>10} {:>8} {:>10} {:>9}\n",
      eta, base.rl.steps, threads, run.measured, run.rl_seconds, run.after_first, run.first_step_s, measured.replayed,
      100 * (measured.replayed / run.measured - 1), measured.engine_r2, measured.trainer_r2, "costs", "tok/s", "error",
      "after 1st step", "error", "RL s", "gen. s", "training s", "1st step", "tok/sample", "own cores");
  v.json = {{"shared_cores", threads},
            {"measured",
             {{"tokens_per_s", run.measured},
              {"after_first_step_tokens_per_s", run.after_first},
              {"response_tokens_per_trained_sample", run.per_sample},
              {"seconds",
               {{"rl", run.rl_seconds},
                {"generating", measured.generate_seconds},
                {"training", measured.train_seconds},
                {"first_step", run.first_step_s}}}}},
            {"replayed_tokens_per_s", measured.replayed},
            {"calibration_tokens_per_s", calibration.measured}};
  v.text += fmt::format("  {:<11} {:>10.0f} {:>8} {:>14.0f} {:>8} {:>8.2f} {:>8.2f} {:>10.2f} {:>8.2f} {:>10.2f}\n",
                        "measured", run.measured, "", run.after_first, "", run.rl_seconds, measured.generate_seconds,
                        measured.train_seconds, run.first_step_s, run.per_sample);
  double worst = 0;
  for (auto [name, costs, delay] :
       {std::make_tuple(std::string{"isolated"},
                        std::make_shared<sim::fitted_costs>(one_thread.alone, one_thread.shared), 0.0),
        std::make_tuple(std::string{"calibrated"},
                        std::make_shared<sim::fitted_costs>(calibration.recorded.costs.rates), start_up)}) {
    auto shared = simulate_row(costs, work, base, eta, 2, threads);
    auto own = simulate_row(costs, work, base, eta, 2, 0);
    // Over the phase with the start-up in front (the calibrated row); from the first step on it drops out.
    double rate = response_rate(shared) * shared.virtual_seconds / (shared.virtual_seconds + delay),
           after = response_rate_after_first_step(shared, work.prompt_tokens);
    double error = rate / run.measured - 1, after_error = after / run.after_first - 1;
    if (name == "calibrated")
      worst = std::max(std::abs(error), std::abs(after_error));
    double per_sample = double(shared.trained_response_tokens) / double(std::max<int64_t>(1, shared.trained_samples));
    double generating = 2 * shared.engine_busy_share * shared.virtual_seconds,
           training = shared.trainer_busy_share * shared.virtual_seconds;
    v.text += fmt::format(
        "  {:<11} {:>10.0f} {:>+7.1f}% {:>14.0f} {:>+7.1f}% {:>8.2f} {:>8.2f} {:>10.2f} {:>8.2f} {:>10.2f} {:>9.0f}\n",
        name, rate, 100 * error, after, 100 * after_error, shared.virtual_seconds + delay, generating, training,
        shared.trained.front().seconds + delay, per_sample, response_rate(own));
    v.json[name] = {{"cost_model", costs->describe()},
                    {"tokens_per_s", rate},
                    {"start_up_s", delay},
                    {"error", error},
                    {"after_first_step_tokens_per_s", after},
                    {"after_first_step_error", after_error},
                    {"tokens_per_s_with_a_core_each", response_rate(own)},
                    {"response_tokens_per_trained_sample", per_sample},
                    {"seconds",
                     {{"rl", shared.virtual_seconds + delay},
                      {"generating", generating},
                      {"training", training},
                      {"first_step", shared.trained.front().seconds + delay}}}};
  }
  v.text += fmt::format(
      "  (gen. s: both engines' steps; own cores: the prediction with a core for each process; isolated: one-thread "
      "steps timed alone and beside each other; calibrated: costs fitted to a synchronous run of the same processes, "
      "seed 2, {:.0f} tok/s, whose lengths both use, and its start-up in front: its first step ended {:.2f} s later "
      "than its replay's)\n"
      "  largest error of the calibrated prediction {:.1f}% (target: 15%)\n",
      calibration.measured, start_up, 100 * worst);
  v.json["largest_error"] = worst;
  return v;
}

}  // namespace

nlohmann::json validate_on_this_machine(bool quick, int threads, std::ostream& out) {
  auto w = demo_workload(quick ? 150 : 600, quick ? 20 : 60, 0);
  auto scratch = fs::temp_directory_path() / ("areal-bench-validate-" + std::to_string(getpid()));
  auto warm = run_job(make_config(w, threads, {"rl.steps=0"}), scratch / "warm", threads, true);
  auto model_dir = scratch / "warm" / "sft_model";
  if (warm.exit_code != 0 || !fs::exists(model_dir))
    throw std::runtime_error("the warm start failed: " + warm.why);
  auto run = [&](const std::string& name, std::vector<std::string> overrides) {
    overrides.insert(overrides.begin(), {"model.path=\"" + model_dir.string() + "\"", "sft.steps=0"});
    auto dir = scratch / name;
    fs::remove_all(dir);
    auto result = run_job(make_config(w, threads, overrides), dir, threads, true);
    if (result.exit_code != 0)
      throw std::runtime_error(name + " failed: " + result.why);
    return std::make_pair(result, dir);
  };
  auto base = make_config(w, threads, {});

  // The isolated cost model, and the calibration run (synchronous, another seed).
  auto rates = measure_cpu_rates(model_dir, w, threads, quick);
  auto isolated = std::make_shared<sim::fitted_costs>(rates.alone, rates.shared);
  auto [calibration, calibration_dir] =
      run("calibration", {"rl.mode=\"sync\"", "rl.record_trajectories=true", "run.seed=2"});
  auto [real_generate, real_train] = busy_seconds(calibration_dir);
  auto calibration_work = workload_of(calibration_dir / "trajectories.jsonl", base);
  auto modelled = simulate_row(isolated, calibration_work, base, 0);
  double generate_factor = real_generate / (modelled.engine_busy_share * modelled.virtual_seconds);
  double train_factor = real_train / (modelled.trainer_busy_share * modelled.virtual_seconds);
  auto how = fmt::format(
      "; x {:.2f} (generation) and x {:.2f} (training): the job's own steps in a synchronous "
      "calibration run (seed 2) against the isolated model",
      generate_factor, train_factor);
  auto in_job = std::make_shared<sim::fitted_costs>(scaled(rates.alone, generate_factor, train_factor, how),
                                                    scaled(rates.shared, generate_factor, train_factor, how));
  out << "isolated cost model: " << isolated->describe();
  out << fmt::format(
      "calibration run (synchronous, seed 2): generated for {:.2f} s and trained for {:.2f} s where "
      "the isolated model says {:.2f} s and {:.2f} s: the job's steps are {:.2f}x and {:.2f}x slower "
      "than alone\n",
      real_generate, real_train, modelled.engine_busy_share * modelled.virtual_seconds,
      modelled.trainer_busy_share * modelled.virtual_seconds, generate_factor, train_factor);

  // The real rows, as bench_async_vs_sync runs them (seed 1; the synchronous one records its lengths).
  std::vector<row> rows = {{"sync", 0}, {"async eta=1", 1}, {"async eta=2", 2}, {"async eta=4", 4}, {"async eta=8", 8}};
  for (auto& r : rows) {
    auto overrides = r.eta == 0 ? std::vector<std::string>{"rl.mode=\"sync\"", "rl.record_trajectories=true"}
                                : std::vector<std::string>{"rl.eta=" + std::to_string(r.eta)};
    auto [result, dir] = run(r.eta == 0 ? "sync" : "async-eta" + std::to_string(r.eta), overrides);
    r.measured = double(result.stats.trained_tokens) / result.rl_seconds;
    r.rl_seconds = result.rl_seconds;
    std::tie(r.generate_seconds, r.train_seconds) = busy_seconds(dir);
    r.replayed = replay_rate(dir, r);
  }
  auto work = workload_of(scratch / "sync" / "trajectories.jsonl", base);

  auto four = validate_four_processes(w, base, model_dir, threads, quick, scratch);
  fs::remove_all(scratch);

  nlohmann::json report = {{"cost_model_isolated", isolated->describe()},
                           {"cost_model_in_job", in_job->describe()},
                           {"generate_factor", generate_factor},
                           {"train_factor", train_factor}};
  for (auto [name, costs] : {std::make_pair("isolated", isolated), std::make_pair("in_job", in_job)}) {
    out << fmt::format(
        "predicted with the {} cost model ({} steps per run; {} prompt and up to {} response tokens, "
        "lengths from the sync row's {}):\n",
        name == std::string{"isolated"} ? "isolated" : "in-job", base.rl.steps, work.prompt_tokens, work.max_new_tokens,
        work.length_source);
    out << fmt::format("  {:<12} {:>16} {:>16} {:>8} {:>14} {:>14} {:>8}\n", "row", "measured tok/s", "predicted tok/s",
                       "error", "measured/sync", "predicted/sync", "error");
    nlohmann::json table = nlohmann::json::array();
    std::string time_table;  // where the time went, per row: measured (the trace) and predicted
    double worst = 0, sync_predicted = 0;
    for (auto& r : rows) {
      auto simulated = simulate_row(costs, work, base, r.eta);
      double predicted = response_rate(simulated);
      // Both rows run one engine (the node's).
      double generate_predicted = simulated.engine_busy_share * simulated.virtual_seconds;
      double train_predicted = simulated.trainer_busy_share * simulated.virtual_seconds;
      time_table += fmt::format("  {:<12} {:>8.2f} {:>8.2f} {:>10.2f} {:>10.2f} {:>8.2f} {:>8.2f}\n", r.name,
                                r.rl_seconds, simulated.virtual_seconds, r.generate_seconds, generate_predicted,
                                r.train_seconds, train_predicted);
      if (r.eta == 0)
        sync_predicted = predicted;
      double error = predicted / r.measured - 1;
      double measured_ratio = r.measured / rows[0].measured, predicted_ratio = predicted / sync_predicted;
      double ratio_error = predicted_ratio / measured_ratio - 1;
      worst = std::max({worst, std::abs(error), std::abs(ratio_error)});
      out << fmt::format("  {:<12} {:>16.0f} {:>16.0f} {:>+7.1f}% {:>14.2f} {:>14.2f} {:>+7.1f}%\n", r.name, r.measured,
                         predicted, 100 * error, measured_ratio, predicted_ratio, 100 * ratio_error);
      table.push_back(
          {{"row", r.name},
           {"measured_tokens_per_s", r.measured},
           {"predicted_tokens_per_s", predicted},
           {"error", error},
           {"measured_ratio_to_sync", measured_ratio},
           {"predicted_ratio_to_sync", predicted_ratio},
           {"ratio_error", ratio_error},
           {"measured_seconds",
            {{"rl", r.rl_seconds}, {"generating", r.generate_seconds}, {"training", r.train_seconds}}},
           {"predicted_seconds",
            {{"rl", simulated.virtual_seconds}, {"generating", generate_predicted}, {"training", train_predicted}}}});
    }
    out << fmt::format("  largest error {:.1f}% (target: 15% per row)\n", 100 * worst);
    out << fmt::format(
        "  where the time went (seconds; measured from the run's trace, predicted by the simulation):\n"
        "  {:<12} {:>8} {:>8} {:>10} {:>10} {:>8} {:>8}\n{}",
        "row", "RL", "pred.", "generating", "pred.", "training", "pred.", time_table);
    report[name] = {{"rows", table}, {"largest_error", worst}};
  }
  // Each row replayed from its own trace: the simulator's schedule given the costs the run itself showed.
  out << "replayed from its own trace (areal simulate --replay: costs fitted to the run's engine and training "
         "steps):\n";
  out << fmt::format("  {:<12} {:>16} {:>16} {:>8} {:>14} {:>14} {:>8} {:>10}\n", "row", "measured tok/s",
                     "replayed tok/s", "error", "measured/sync", "replayed/sync", "error", "fit R^2");
  nlohmann::json replays = nlohmann::json::array();
  double worst = 0;
  for (auto& r : rows) {
    double error = r.replayed / r.measured - 1;
    double measured_ratio = r.measured / rows[0].measured, replayed_ratio = r.replayed / rows[0].replayed;
    double ratio_error = replayed_ratio / measured_ratio - 1;
    worst = std::max({worst, std::abs(error), std::abs(ratio_error)});
    out << fmt::format("  {:<12} {:>16.0f} {:>16.0f} {:>+7.1f}% {:>14.2f} {:>14.2f} {:>+7.1f}% {:>4.2f}/{:.2f}\n",
                       r.name, r.measured, r.replayed, 100 * error, measured_ratio, replayed_ratio, 100 * ratio_error,
                       r.engine_r2, r.trainer_r2);
    replays.push_back({{"row", r.name},
                       {"measured_tokens_per_s", r.measured},
                       {"replayed_tokens_per_s", r.replayed},
                       {"error", error},
                       {"ratio_error", ratio_error},
                       {"engine_fit_r2", r.engine_r2},
                       {"trainer_fit_r2", r.trainer_r2}});
  }
  out << fmt::format("  largest error {:.1f}% (target: 15% per row)\n", 100 * worst);
  report["replayed"] = {{"rows", replays}, {"largest_error", worst}};

  out << four.text;
  report["four_processes"] = four.json;
  return report;
}

}  // namespace areal::bench
