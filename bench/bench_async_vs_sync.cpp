// bench_async_vs_sync: the RL pipeline in synchronous and asynchronous mode,
// side by side in one invocation, same model, task, seeds and cores.
//   1. Alone, at each thread count: generation capacity G (response tokens/s
//      of one engine with a full continuous batch) and training capacity T
//      (trained tokens/s of trainer::ppo_update, one data-parallel replica per
//      thread, as the job's trainer runs); then both phases at once, measured
//      at once, as the job runs them together (on shared cores: the engine on
//      threads / 2, the trainer on all; on a static split: k and threads - k).
//      The bound: the best mix in time of these configurations that trains no
//      more than it generates, printed with the mix it comes from (and, for
//      comparison, what it would be were phases on split cores as fast as
//      alone). And the synchronous ideal: both phases alternating on all
//      threads, 1/(1/G + 1/T). All of it measured again after each round of
//      runs (below), and each round's runs set against the mean of the bound
//      measured before and after them: the machine's speed drifts within
//      minutes, and a bound measured once can land in a slow minute.
//   2. The real job (controller, rollout, reward pool, trainer actors) in
//      synchronous mode and asynchronous mode (eta = 1, 2, 4, 8, cores shared),
//      plus the alternatives: a static core split at eta = 2 and plain PPO
//      (no decoupled objective) at eta = 4 and 8. For each: trained tokens/s,
//      samples/s, the ratio to synchronous, the fraction of the bound, the
//      share of the time spent filling and draining the pipeline (before the
//      first step beyond one step interval, after the last), and held-out
//      greedy accuracy after the same number of samples. And where each run's
//      time went (its trace.json): the trainer's and the engine's shares of
//      the RL time in steps, their speeds there against T and G alone, how
//      much of the training had an engine step beside it, and the engine's
//      sequences per step against its slots: what keeps a run from the bound.
//   3. Two workloads: the demo's (tiny preset, running sums), and a
//      long-tail one on the small preset (outputs of 2-32 terms; on 2 CPU
//      cores training still takes most of the time), 60 steps in full mode
//      (at 6, filling and draining the pipeline took 34-59% of the time; at
//      30, 7-13%).
//   4. --rounds N runs every row N times, round-robin, each against its own
//      round's sync, and prints each row's mean and range: on this shared
//      machine the same row's speed moved by up to a third between minutes.
//   5. --device, --preset, --etas and --steps run it elsewhere: on a GPU (bench/gpu/check.sh:
//      --device cuda --threads 1 --workload long-tail --preset qwen2-0.5b --etas 1,4,8),
//      every model of the runs and of the bound on that device.
// Usage: bench_async_vs_sync [--quick] [--json FILE] [--threads N] [--workload demo|long-tail] [--rounds N]
//                            [--device cpu|cuda[:N]] [--preset NAME] [--etas LIST] [--steps N]
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "bench_jobs.hpp"
#include "phase_capacity.hpp"

#include "areal/actors/rl_job.hpp"
#include "areal/kernels/allocator.hpp"
#include "areal/kernels/device.hpp"
#include "areal/kernels/engine.hpp"
#include "areal/kernels/model_config.hpp"
#include "areal/runtime/cpus.hpp"
#include "areal/runtime/log.hpp"

namespace fs = std::filesystem;
using namespace areal;
using areal::bench::bracket;
using areal::bench::make_config;
using areal::bench::measure_bound;
using areal::bench::run_job;
using areal::bench::seconds_since;
using areal::bench::workload;

namespace {

struct run_row {
  std::string name;
  std::vector<std::string> overrides;
  bool share = true;
};

}  // namespace

int main(int argc, char** argv) {
  fit_blas_core(argc, argv);  // with every argument: it may execute the benchmark again
  kernels::tune_allocator();
  // --workload demo|long-tail (default: both); the other flags are every benchmark's.
  auto only = bench::take_flag(argc, argv, "--workload", "");
  const char* usage =
      "bench_async_vs_sync [--workload demo|long-tail] [--rounds N] [--device cpu|cuda[:N]] [--preset NAME] "
      "[--etas 1,4,8] [--steps N]";
  if (!only.empty() && only != "demo" && only != "long-tail") {
    std::cerr << "--workload " << only << ": not a workload; give demo or long-tail\nusage: " << usage << "\n";
    return 2;
  }
  // --rounds N: every row N times, round-robin (sync first in each round, the others against it), so that a
  // drift of the machine's speed over the minutes of a run spreads over the rows instead of favouring some.
  auto rounds_text = bench::take_flag(argc, argv, "--rounds", "1");
  int rounds = 0;
  try {
    size_t used = 0;
    rounds = std::stoi(rounds_text, &used);
    if (used != rounds_text.size())
      rounds = 0;
  } catch (const std::exception&) {
    rounds = 0;
  }
  if (rounds < 1 || rounds > 20) {
    std::cerr << "--rounds " << rounds_text << ": give a whole number from 1 to 20\nusage: " << usage << "\n";
    return 2;
  }
  // --device D: every model of the runs and of the bound on D (model.device): cuda on a GPU machine, where
  // --threads 1 fits (one trainer replica per GPU; threads are a CPU's way to use its cores).
  auto device = bench::take_flag(argc, argv, "--device", "cpu");
  // --preset P: the workloads' model shape instead of their own (qwen2-0.5b on a GPU).
  auto preset = bench::take_flag(argc, argv, "--preset", "");
  // --etas LIST: the asynchronous rows' staleness bounds (default 1,2,4,8); given, the alternatives (a static
  // core split, plain PPO) are left out.
  auto etas_text = bench::take_flag(argc, argv, "--etas", "");
  std::vector<int> etas = {1, 2, 4, 8};
  if (!etas_text.empty()) {
    etas.clear();
    std::istringstream list(etas_text);
    std::string item;
    while (std::getline(list, item, ',')) {
      int eta = item.empty() || item.size() > 3 || item.find_first_not_of("0123456789") != std::string::npos
                    ? 0
                    : std::stoi(item);
      if (eta < 1) {
        std::cerr << "--etas " << etas_text << ": give staleness bounds of 1 or more, separated by commas (1,4,8)\n"
                  << "usage: " << usage << "\n";
        return 2;
      }
      etas.push_back(eta);
    }
  }
  // --steps N: every workload's RL steps instead of its own (a check with a time limit).
  auto steps_text = bench::take_flag(argc, argv, "--steps", "");
  int64_t steps = 0;
  if (!steps_text.empty()) {
    steps = steps_text.size() <= 6 && steps_text.find_first_not_of("0123456789") == std::string::npos
                ? std::stoll(steps_text)
                : 0;
    if (steps < 2) {
      std::cerr << "--steps " << steps_text << ": give a whole number of RL steps, 2 or more\nusage: " << usage << "\n";
      return 2;
    }
  }
  try {
    kernels::tensor_options(device, "float32");
    if (!preset.empty())
      kernels::preset(preset, 64);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\nusage: " << usage << "\n";
    return 2;
  }
  auto opts = bench::parse_options(argc, argv, usage);
  int threads = std::max(1, opts.threads);
  auto facts = kernels::probe_blas();
  std::cout << "bench_async_vs_sync: " << threads << " compute threads (" << areal::cpus().describe() << "); "
            << kernels::describe(facts) << "; device " << device << (preset.empty() ? "" : "; preset " + preset)
            << (opts.quick ? "; --quick" : "") << "\n";
  spdlog::set_level(spdlog::level::warn);

  std::vector<workload> workloads = {
      bench::demo_workload(opts.quick ? 150 : 600, opts.quick ? 6 : 30, opts.quick ? 64 : 256),
      {"long tail (small preset, running sums of 2-32 terms up to 99, median 5)",
       "small",
       99,
       32,
       5.0,
       0.0,
       160,
       opts.quick ? 10 : 30,
       opts.quick ? 3 : 60,
       16,
       4,
       opts.quick ? 16 : 32,
       {"sft.batch_size=8", "rl.rollout_slots=64"}},
  };
  if (only == "demo")
    workloads.pop_back();
  else if (only == "long-tail")
    workloads.erase(workloads.begin());
  for (auto& w : workloads) {
    w.extra.push_back("model.device=\"" + device + "\"");
    if (!preset.empty()) {
      w.name += ", with the " + preset + " preset";
      w.preset = preset;
    }
    if (steps > 0)
      w.rl_steps = steps;
  }
  auto scratch = fs::temp_directory_path() / ("areal-bench-async-" + std::to_string(getpid()));
  // A run that fails ends the benchmark: its figures would say nothing.
  auto fail = [&](const std::string& why) {
    std::cerr << why << "\n";
    fs::remove_all(scratch);
    return 1;
  };
  nlohmann::json report = {{"bench", "bench_async_vs_sync"},
                           {"threads", threads},
                           {"device", device},
                           {"preset", preset.empty() ? "the workloads' own" : preset},
                           {"blas", kernels::describe(facts)},
                           {"quick", opts.quick}};
  for (auto& w : workloads) {
    std::cout << "\n== workload: " << w.name << "; " << w.rl_steps << " RL steps of " << w.batch_size
              << " trajectories\n";
    // The warm start, once: every run starts from the same model.
    auto warm_dir = scratch / "warm";
    auto warm = run_job(make_config(w, threads, {"rl.steps=0", "eval.prompts=0"}), warm_dir, threads, true);
    auto model_dir = warm_dir / "sft_model";
    if (warm.exit_code != 0 || !fs::exists(model_dir))
      return fail("the warm start failed: " + warm.why);
    std::cout << "warm start: " << w.sft_steps << " SFT steps in " << std::setprecision(3) << warm.sft_seconds
              << " s\n";

    // 1. The bound (phase_capacity.hpp), measured before the runs and again after each round: a round's
    // rows are set against the mean of the bound before and after them. Measured once, at the start, the
    // bound landed in a slow minute of this machine in one full run, and that run's sync rows read 0.92-1.1
    // of it.
    std::vector<kernels::generation_output> outputs;
    auto before = measure_bound(model_dir, w, threads, opts.quick, outputs, &std::cout);
    std::cout << "bound over the configurations the job runs (one engine, one trainer replica per thread; phases "
                 "together measured together): "
              << before.bound << " trained tokens/s, from " << before.bound_how << "\n";
    std::cout << "(were phases on split cores as fast as alone: " << before.assumed_bound << " tokens/s, from "
              << before.assumed_how << ")\n";
    std::cout << "alternating phases at all " << threads << " threads, 1/(1/G + 1/T) = " << before.alternating
              << " tokens/s (the synchronous ideal), " << before.alternating / before.bound << " of the bound\n";
    auto first_bound = before;
    nlohmann::json bounds_measured = nlohmann::json::array({before.bound});

    // 2. The runs.
    std::vector<run_row> rows = {{"sync", {"rl.mode=\"sync\""}, true}};
    auto slots = make_config(w, threads, {}).rl.rollout_slots;  // the engine's batch when full
    for (int eta : etas)
      rows.push_back({"async eta=" + std::to_string(eta), {"rl.eta=" + std::to_string(eta)}, true});
    if (etas_text.empty()) {
      if (threads > 1)
        rows.push_back({"async eta=2, static core split", {"rl.eta=2"}, false});
      for (int eta : {4, 8})
        rows.push_back({"async eta=" + std::to_string(eta) + ", plain PPO",
                        {"rl.eta=" + std::to_string(eta), "rl.decoupled=false"},
                        true});
    }
    nlohmann::json runs = nlohmann::json::array();
    double sync_rate = 0, sync_accuracy = 0, sync_cpu_per_token = 0;
    struct spread {
      std::vector<double> vs_sync, of_bound, tokens_per_s;
    };
    std::vector<spread> spreads(rows.size());
    // What a run left behind, read before the next run reuses its directory.
    struct outcome {
      size_t row;
      std::string label;
      rl_job_result result;
      double fill_drain;
      bench::time_use use;
    };
    for (int round = 0; round < rounds; ++round) {
      std::vector<outcome> outcomes;
      for (size_t r = 0; r < rows.size(); ++r) {
        auto& row = rows[r];
        auto label = rounds > 1 ? row.name + " (round " + std::to_string(round + 1) + ")" : row.name;
        auto overrides = row.overrides;
        overrides.push_back("model.path=\"" + model_dir.string() + "\"");
        overrides.push_back("sft.steps=0");
        auto dir = scratch / "run";
        fs::remove_all(dir);
        auto result = run_job(make_config(w, threads, overrides), dir, threads, row.share);
        if (result.exit_code != 0)
          return fail(label + ": the run failed: " + result.why);
        // Fill and drain: the time before the first step beyond one steady step
        // interval, and after the last step (from metrics.jsonl's step times).
        std::vector<double> step_times;
        {
          std::ifstream metrics(dir / "metrics.jsonl");
          std::string line;
          while (std::getline(metrics, line)) {
            auto j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_object() && j.value("event", "") == "step")
              step_times.push_back(j.value("time_s", 0.0));
          }
        }
        double fill_drain = -1;
        if (step_times.size() >= 2) {
          double interval = (step_times.back() - step_times.front()) / static_cast<double>(step_times.size() - 1);
          fill_drain =
              (std::max(0.0, step_times.front() - interval) + std::max(0.0, result.rl_seconds - step_times.back())) /
              result.rl_seconds;
        }
        bench::time_use use;
        try {
          use = bench::read_time_use(dir / "trace.json");
        } catch (const std::exception& e) {
          return fail(label + ": " + e.what());
        }
        outcomes.push_back({r, label, std::move(result), fill_drain, use});
        std::cerr << "  " << label << ": ran (" << outcomes.back().result.rl_seconds << " s of RL)" << std::endl;
      }
      auto after = measure_bound(model_dir, w, threads, opts.quick, outputs, nullptr);
      bounds_measured.push_back(after.bound);
      auto around = bracket(before, after);
      std::cout << (rounds > 1 ? "round " + std::to_string(round + 1) + ": " : std::string{}) << "the bound "
                << before.bound << " tokens/s before these runs, " << after.bound << " after; each against the mean, "
                << around.bound << std::endl;
      before = after;
      double bound = around.bound;
      auto& caps = around.caps;
      for (auto& o : outcomes) {
        size_t r = o.row;
        auto& row = rows[r];
        auto& label = o.label;
        auto& result = o.result;
        auto& use = o.use;
        double fill_drain = o.fill_drain;
        auto& s = result.stats;
        double tokens_per_s = static_cast<double>(s.trained_tokens) / result.rl_seconds;
        double samples_per_s = static_cast<double>(s.trained) / result.rl_seconds;
        // How busy the cores were (the process's CPU time over the RL phase), and
        // the CPU time each trained token cost, every thread of the job counted.
        double cores_busy = result.rl_cpu_seconds / (result.rl_seconds * threads);
        double cpu_per_token = result.rl_cpu_seconds / static_cast<double>(std::max<int64_t>(1, s.trained_tokens));
        if (row.name == "sync") {
          sync_rate = tokens_per_s;
          sync_accuracy = result.accuracy_after;
          sync_cpu_per_token = cpu_per_token;
        }
        spreads[r].vs_sync.push_back(tokens_per_s / sync_rate);
        spreads[r].of_bound.push_back(tokens_per_s / bound);
        spreads[r].tokens_per_s.push_back(tokens_per_s);
        std::cout << label << ": " << tokens_per_s << " trained tokens/s, " << samples_per_s << " samples/s; vs sync "
                  << tokens_per_s / sync_rate << "x; " << tokens_per_s / bound << " of the bound; fill and drain "
                  << 100 * fill_drain << "% of the time; held-out accuracy " << 100 * result.accuracy_before << "% -> "
                  << 100 * result.accuracy_after << "% (vs sync " << 100 * (result.accuracy_after - sync_accuracy)
                  << " points) after " << s.trained << " samples; max staleness " << s.max_staleness << ", dropped "
                  << s.dropped << "; cores busy " << cores_busy << ", CPU per trained token " << 1e6 * cpu_per_token
                  << " us (vs sync " << cpu_per_token / sync_cpu_per_token << "x)" << std::endl;
        // Where the time went, against the capacities the bound is made of: the
        // trainer's share of the RL time and its speed within its steps against T
        // alone; the engine's share, its speed against G alone (a full batch) on
        // the threads it gets beside the trainer (all of them in sync, where it
        // computes alone), and the sequences it decodes a step.
        int engine_threads = row.name == "sync" ? threads : std::max(1, threads / 2);
        int trainer_threads = row.share ? threads : std::max(1, threads / 2);
        double trainer_share = use.train_s / result.rl_seconds;
        double training_vs_alone =
            static_cast<double>(s.trained_tokens) / use.train_s / caps[static_cast<size_t>(trainer_threads)].training;
        double engine_beside = use.generate_beside_train_s / use.train_s;
        double engine_share = use.generate_s / result.rl_seconds;
        double decoding_vs_alone = static_cast<double>(use.decode_rows) / std::max(1e-9, use.generate_s) /
                                   caps[static_cast<size_t>(engine_threads)].generation;
        double mean_batch =
            static_cast<double>(use.decode_rows) / static_cast<double>(std::max<int64_t>(1, use.engine_steps));
        // CPU time of the threads that recorded the steps, against the steps' wall
        // time: how much of a step its thread computed (the rest it waited for a
        // core, or for the other replicas), and the engine's decoding per CPU
        // second of its one thread against G alone on one.
        double trainer_computing = use.train_cpu_s / std::max(1e-9, use.train_s);
        double engine_computing = use.generate_cpu_s / std::max(1e-9, use.generate_s);
        // The replicas' lockstep: of the replicas' time in steps (step time x replicas), the share
        // a replica's part had ended and it waited for the pass's last.
        double replicas_waiting = use.train_replicas_waited_s / std::max(1e-9, use.train_s * trainer_threads);
        std::cout << "  time: the trainer in a step " << trainer_share << " of the RL time, at " << training_vs_alone
                  << " of T alone on " << trainer_threads << " thread(s) (an engine step beside it " << engine_beside
                  << " of that time; its first replica's thread computing " << trainer_computing
                  << " of it; its replicas waiting for one another " << replicas_waiting
                  << " of theirs); the engine in a step " << engine_share << " of the RL time, decoding at "
                  << decoding_vs_alone << " of G alone on " << engine_threads << " thread(s) (its thread computing "
                  << engine_computing << " of that time";
        double decoding_per_cpu = 0;
        if (engine_threads == 1 && use.generate_cpu_s > 0) {
          decoding_per_cpu = static_cast<double>(use.decode_rows) / use.generate_cpu_s / caps[1].generation;
          std::cout << "; per CPU second " << decoding_per_cpu << " of G alone";
        }
        std::cout << "), " << mean_batch << " sequences a step of " << slots << " slots" << std::endl;
        if (row.name == "sync" && device == "cpu")
          // A schedule that keeps every core busy with no more CPU work per token
          // trains at most 1 / cores_busy times as fast: the ceiling that
          // overlapping the phases can reach on this workload, measured.
          std::cout << "  (sync kept the cores busy " << cores_busy << " of the time: at its CPU time per token, no "
                    << "schedule on " << threads << " cores trains faster than " << 1 / cores_busy << "x sync)"
                    << std::endl;
        runs.push_back({{"name", label},
                        {"cores_busy", cores_busy},
                        {"cpu_seconds_per_trained_token", cpu_per_token},
                        {"trained_tokens_per_s", tokens_per_s},
                        {"samples_per_s", samples_per_s},
                        {"ratio_to_sync", tokens_per_s / sync_rate},
                        {"fraction_of_bound", tokens_per_s / bound},
                        {"fill_drain_fraction", fill_drain},
                        {"accuracy_before", result.accuracy_before},
                        {"accuracy_after", result.accuracy_after},
                        {"trained_samples", s.trained},
                        {"max_staleness", s.max_staleness},
                        {"dropped", s.dropped},
                        {"rl_seconds", result.rl_seconds},
                        {"trainer_step_fraction", trainer_share},
                        {"training_speed_vs_alone", training_vs_alone},
                        {"engine_beside_trainer_fraction", engine_beside},
                        {"engine_step_fraction", engine_share},
                        {"decoding_speed_vs_alone", decoding_vs_alone},
                        {"trainer_thread_computing_fraction", trainer_computing},
                        {"trainer_replicas_waiting_fraction", replicas_waiting},
                        {"engine_thread_computing_fraction", engine_computing},
                        {"decoding_per_cpu_second_vs_alone", decoding_per_cpu},
                        {"mean_decode_batch", mean_batch},
                        {"bound_around", bound}});
      }
    }
    nlohmann::json over_rounds = nlohmann::json::array();
    if (rounds > 1) {
      auto mean = [](const std::vector<double>& v) {
        double sum = 0;
        for (auto x : v)
          sum += x;
        return sum / static_cast<double>(std::max<size_t>(1, v.size()));
      };
      auto range = [](const std::vector<double>& v) {
        std::ostringstream os;
        os << std::setprecision(3) << *std::min_element(v.begin(), v.end()) << "-"
           << *std::max_element(v.begin(), v.end());
        return os.str();
      };
      std::cout << "over " << rounds << " rounds (mean, then the range):\n";
      for (size_t r = 0; r < rows.size(); ++r) {
        auto& sp = spreads[r];
        std::cout << "  " << rows[r].name << ": " << mean(sp.tokens_per_s) << " trained tokens/s ("
                  << range(sp.tokens_per_s) << "); vs sync " << mean(sp.vs_sync) << "x (" << range(sp.vs_sync) << "); "
                  << mean(sp.of_bound) << " of the bound (" << range(sp.of_bound) << ")\n";
        over_rounds.push_back({{"name", rows[r].name},
                               {"trained_tokens_per_s", sp.tokens_per_s},
                               {"ratio_to_sync", sp.vs_sync},
                               {"fraction_of_bound", sp.of_bound}});
      }
    }
    nlohmann::json capacities = nlohmann::json::array();
    for (int k = 1; k <= threads; ++k)
      capacities.push_back({{"threads", k},
                            {"generation_tokens_per_s", first_bound.caps[static_cast<size_t>(k)].generation},
                            {"training_tokens_per_s", first_bound.caps[static_cast<size_t>(k)].training}});
    nlohmann::json measured = nlohmann::json::array();
    for (auto& config : first_bound.configurations)
      measured.push_back({{"configuration", config.name},
                          {"generation_tokens_per_s", config.generation},
                          {"training_tokens_per_s", config.training}});
    report["workloads"].push_back({{"name", w.name},
                                   {"capacities", capacities},
                                   {"configurations", measured},
                                   {"bound", first_bound.bound},
                                   {"bound_from", first_bound.bound_how},
                                   {"bound_if_phases_did_not_interfere", first_bound.assumed_bound},
                                   {"alternating_bound", first_bound.alternating},
                                   {"bounds_measured", bounds_measured},
                                   {"runs", runs},
                                   {"rounds", rounds},
                                   {"over_rounds", over_rounds}});
  }
  fs::remove_all(scratch);
  if (!opts.json_path.empty())
    std::ofstream(opts.json_path) << report.dump(2) << "\n";
  return 0;
}
