// bench_simulate's validation on this machine (see sim_validation.hpp).
#include "sim_validation.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "areal/sim/simulation.hpp"
#include "bench_jobs.hpp"
#include "cpu_costs.hpp"

namespace areal::bench {
namespace fs = std::filesystem;

namespace {

struct row {
  std::string name;
  int64_t eta;  // 0: synchronous
  double measured = 0, predicted = 0;  // trained tokens/s over the RL phase
};

// The mean prompt length of a run's trained samples (its trajectories.jsonl).
double mean_prompt_tokens(const fs::path& trajectories) {
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
  return n > 0 ? sum / n : 0;
}

}  // namespace

nlohmann::json validate_on_this_machine(bool quick, int threads, std::ostream& out) {
  auto w = demo_workload(quick ? 150 : 600, quick ? 20 : 60, 0);
  auto scratch = fs::temp_directory_path() / ("areal-bench-validate-" + std::to_string(getpid()));
  auto warm = run_job(make_config(w, threads, {"rl.steps=0"}), scratch / "warm", threads, true);
  auto model_dir = scratch / "warm" / "sft_model";
  if (warm.exit_code != 0 || !fs::exists(model_dir))
    throw std::runtime_error("the warm start failed: " + warm.why);

  auto rates = measure_cpu_rates(model_dir, w, threads, quick);
  auto costs = std::make_shared<sim::fitted_costs>(rates.alone, rates.shared);
  out << costs->describe();

  // The real rows, as bench_async_vs_sync runs them (the synchronous one records its samples' lengths).
  std::vector<row> rows = {{"sync", 0}, {"async eta=1", 1}, {"async eta=2", 2}, {"async eta=4", 4}, {"async eta=8", 8}};
  auto base = make_config(w, threads, {});
  for (auto& r : rows) {
    std::vector<std::string> overrides = {"model.path=\"" + model_dir.string() + "\"", "sft.steps=0"};
    if (r.eta == 0)
      overrides.insert(overrides.end(), {"rl.mode=\"sync\"", "rl.record_trajectories=true"});
    else
      overrides.push_back("rl.eta=" + std::to_string(r.eta));
    auto dir = scratch / (r.eta == 0 ? "sync" : "run");
    fs::remove_all(dir);
    auto result = run_job(make_config(w, threads, overrides), dir, threads, true);
    if (result.exit_code != 0)
      throw std::runtime_error(r.name + " failed: " + result.why);
    r.measured = double(result.stats.trained_tokens) / result.rl_seconds;
  }

  // The same rows in virtual time: the real controller, one engine and the
  // trainer on this node's shared cores, the lengths the synchronous run generated.
  auto trajectories = (scratch / "sync" / "trajectories.jsonl").string();
  sim::workload work;
  work.prompt_tokens = std::max<int64_t>(1, std::llround(mean_prompt_tokens(trajectories)));
  work.max_new_tokens = base.rl.max_new_tokens;
  work.length_table = sim::read_length_table(trajectories);
  work.length_source = "the synchronous run's trajectories.jsonl";
  work.reward_workers = base.reward.workers;
  work.reward_median_s = 50e-6;  // assumption: checking a running sum's answer, tens of microseconds
  for (auto& r : rows) {
    sim::sim_setup s;
    s.costs = costs;
    s.work = work;
    s.colocated = r.eta == 0;
    s.devices = r.eta == 0 ? 1 : 2;  // async: the engine and the trainer, each on the shared cores
    s.generation_share = 0.5;
    s.eta = r.eta;
    s.batch_prompts = base.rl.batch_size / base.rl.group_size;
    s.group_size = base.rl.group_size;
    s.steps = base.rl.steps;
    s.engine_slots = base.rl.rollout_slots;
    s.max_concurrent = base.rl.max_concurrent;
    s.keep_log = false;
    r.predicted = sim::simulate(s).trained_tokens_per_second();
  }
  fs::remove_all(scratch);

  out << fmt::format("  {:<12} {:>16} {:>16} {:>8} {:>14} {:>14} {:>8}\n", "row", "measured tok/s", "predicted tok/s",
                     "error", "measured/sync", "predicted/sync", "error");
  nlohmann::json table = nlohmann::json::array();
  double worst = 0;
  for (auto& r : rows) {
    double error = r.predicted / r.measured - 1;
    double measured_ratio = r.measured / rows[0].measured, predicted_ratio = r.predicted / rows[0].predicted;
    double ratio_error = predicted_ratio / measured_ratio - 1;
    worst = std::max({worst, std::abs(error), std::abs(ratio_error)});
    out << fmt::format("  {:<12} {:>16.0f} {:>16.0f} {:>+7.1f}% {:>14.2f} {:>14.2f} {:>+7.1f}%\n", r.name, r.measured,
                       r.predicted, 100 * error, measured_ratio, predicted_ratio, 100 * ratio_error);
    table.push_back({{"row", r.name},
                     {"measured_tokens_per_s", r.measured},
                     {"predicted_tokens_per_s", r.predicted},
                     {"error", error},
                     {"measured_ratio_to_sync", measured_ratio},
                     {"predicted_ratio_to_sync", predicted_ratio},
                     {"ratio_error", ratio_error}});
  }
  out << fmt::format("  largest error {:.1f}% (target: 15% per row); {} steps per run, {} prompt and up to {} "
                     "response tokens, lengths from {}\n",
                     100 * worst, base.rl.steps, work.prompt_tokens, work.max_new_tokens, work.length_source);
  return {{"rows", table}, {"largest_error", worst}, {"cost_model", costs->describe()}};
}

}  // namespace areal::bench
