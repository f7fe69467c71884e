// Replaying a finished run in virtual time: the simulator's cost model fitted
// to the run's own trace (every engine step's batch, context and prefill, every
// training step's tokens, every reward check), its workload taken from what it
// generated, and the simulated schedule compared with the one its metrics
// recorded, step by step. With overrides (another eta, more rollout workers) the
// same fitted costs answer "what if". No actor logic besides the simulation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "areal/runtime/config.hpp"
#include "areal/sim/cost_model.hpp"
#include "areal/sim/simulation.hpp"
#include "areal/sim/workload.hpp"

namespace areal::sim {

/// A least-squares fit with non-negative coefficients and how well it fits.
struct linear_fit {
  std::vector<double> coefficients;
  double r2 = 0;  // 1 - residual / total sum of squares
  size_t rows = 0;
};
/// Columns are scaled to a common range before fitting (their magnitudes differ
/// by orders: a batch of 10 beside a million attended positions).
linear_fit fit_columns(const std::vector<std::vector<double>>& x, const std::vector<double>& y);

/// The costs a run's Chrome trace (trace.json) shows, fitted to its spans.
struct trace_costs {
  measured_rates rates;  // transfer is left 0: it comes from the metrics
  linear_fit engine, trainer;
  int64_t engines = 0;          // rollout tracks that generated
  double generate_seconds = 0;  // in engine steps, all engines
  double train_seconds = 0;     // in training steps
  double reward_median_s = 0, reward_sigma = 0;
  int64_t reward_checks = 0;
  int64_t trained_sequences = 0, trained_sequence_tokens = 0;  // prompt + response
};
/// Throws std::runtime_error saying what the trace lacks (e.g. a trace written
/// before engine steps carried their facts).
trace_costs fit_trace(const nlohmann::json& trace);

/// One step of the real run, from its metrics line.
struct recorded_step {
  int64_t version = 0;
  double seconds = 0;  // since the RL phase began
  int64_t samples = 0, response_tokens = 0;
  int64_t staleness_max = 0;
  double response_mean = 0;
  int64_t response_min = 0, response_max = 0;
  double weight_sync_s = 0;
};

/// What a finished run's directory says: its steps, its costs and its workload.
struct recorded_run {
  std::filesystem::path dir;
  std::vector<recorded_step> steps;
  trace_costs costs;
  workload work;
  std::string notes;  // how each part was taken, one line each
};
/// Reads RUN_DIR's metrics.jsonl, trace.json and (when recorded)
/// trajectories.jsonl; `config` is the run's configuration (its config.toml,
/// with any overrides). Throws std::runtime_error naming the file and what is
/// wrong with it.
recorded_run read_recorded_run(const std::filesystem::path& dir, const run_config& config);

/// The simulated run of `config` with the recorded run's costs and workload.
sim_setup replay_setup(const recorded_run& run, const run_config& config);

/// `areal simulate --replay RUN_DIR [--set ...]`: prints the fitted costs and
/// the recorded against the replayed schedule (a what-if when `overrides`
/// change more than the [simulate] outputs); writes simulate.json / simulate.log when set. Exit 0, 1 when the
/// simulation failed, 2 when the run directory cannot be replayed.
int replay_command(const run_config& config, const std::filesystem::path& dir,
                   const std::vector<std::string>& overrides, std::ostream& out, std::ostream& err);

}  // namespace areal::sim
