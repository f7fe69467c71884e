// Replaying a finished run in virtual time (replay.hpp).
#include "areal/sim/replay.hpp"

#include "areal/sim/simulate_command.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

namespace areal::sim {
namespace fs = std::filesystem;
using nlohmann::json;

linear_fit fit_columns(const std::vector<std::vector<double>>& x, const std::vector<double>& y) {
  linear_fit f;
  f.rows = x.size();
  size_t k = x.empty() ? 0 : x[0].size();
  std::vector<double> scale(k, 0.0);
  for (auto& row : x)
    for (size_t j = 0; j < k; ++j)
      scale[j] = std::max(scale[j], std::abs(row[j]));
  auto scaled = x;
  for (auto& row : scaled)
    for (size_t j = 0; j < k; ++j)
      row[j] = scale[j] > 0 ? row[j] / scale[j] : 0.0;
  f.coefficients = fit_nonnegative(scaled, y);
  for (size_t j = 0; j < k; ++j)
    f.coefficients[j] = scale[j] > 0 ? f.coefficients[j] / scale[j] : 0.0;
  double mean = 0;
  for (auto v : y)
    mean += v / double(std::max<size_t>(1, y.size()));
  double residual = 0, total = 0;
  for (size_t r = 0; r < x.size(); ++r) {
    double predicted = 0;
    for (size_t j = 0; j < k; ++j)
      predicted += f.coefficients[j] * x[r][j];
    residual += (y[r] - predicted) * (y[r] - predicted);
    total += (y[r] - mean) * (y[r] - mean);
  }
  f.r2 = total > 0 ? 1 - residual / total : 1;
  return f;
}

namespace {

double arg(const json& args, const char* name) {
  auto it = args.find(name);
  return it != args.end() && it->is_number() ? it->get<double>() : 0.0;
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

trace_costs fit_trace(const json& trace) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    throw std::runtime_error("not a Chrome trace (no \"traceEvents\" list)");
  trace_costs out;
  std::vector<std::vector<double>> engine_x, trainer_x;
  std::vector<double> engine_y, trainer_y, reward_s;
  std::set<int64_t> engine_tracks;
  int64_t bare_steps = 0;  // engine steps without their facts (a trace of an older areal)
  for (auto& e : trace["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("dur") || !e["dur"].is_number())
      continue;
    auto name = e.value("name", "");
    double seconds = e["dur"].get<double>() * 1e-6;
    auto args = e.value("args", json::object());
    if (name == "generate") {
      if (!args.contains("batch")) {
        bare_steps++;
        continue;
      }
      double batch = arg(args, "batch"), prefill = arg(args, "prefill");
      if (batch == 0 && prefill == 0)
        continue;
      engine_x.push_back({1.0, batch, arg(args, "context"), prefill, arg(args, "attended")});
      engine_y.push_back(seconds);
      engine_tracks.insert(e.value("tid", int64_t{0}));
      out.generate_seconds += seconds;
    } else if (name == "train" && args.contains("tokens")) {
      trainer_x.push_back({1.0, arg(args, "tokens"), arg(args, "attended")});
      trainer_y.push_back(seconds);
      out.train_seconds += seconds;
      out.trained_sequences += static_cast<int64_t>(arg(args, "sequences"));
      out.trained_sequence_tokens += static_cast<int64_t>(arg(args, "tokens"));
    } else if (name == "reward") {
      reward_s.push_back(seconds);
    }
  }
  if (engine_x.size() < 5)
    throw std::runtime_error(
        bare_steps > 0 ? fmt::format("its {} engine steps carry no facts (batch, context, prefill): the trace was "
                                     "written by an older areal; replay a run of this version",
                                     bare_steps)
                       : "it holds fewer than 5 engine steps (\"generate\" spans): too few to fit their cost");
  if (trainer_x.size() < 2)
    throw std::runtime_error(
        "it holds fewer than 2 training steps with their tokens (\"train\" spans): too few to "
        "fit their cost");
  out.engines = static_cast<int64_t>(engine_tracks.size());
  out.engine = fit_columns(engine_x, engine_y);
  out.trainer = fit_columns(trainer_x, trainer_y);
  auto& r = out.rates;
  r.decode_base = out.engine.coefficients[0];
  r.decode_per_sequence = out.engine.coefficients[1];
  r.decode_per_context = out.engine.coefficients[2];
  r.prefill_per_token = out.engine.coefficients[3];
  r.prefill_per_attended = out.engine.coefficients[4];
  r.train_base = out.trainer.coefficients[0];
  r.train_per_token = out.trainer.coefficients[1];
  r.train_per_attended = out.trainer.coefficients[2];
  out.reward_checks = static_cast<int64_t>(reward_s.size());
  if (!reward_s.empty()) {
    out.reward_median_s = median(reward_s);
    double mean = 0, square = 0;
    for (auto s : reward_s) {
      double l = std::log(std::max(s, 1e-9));
      mean += l;
      square += l * l;
    }
    mean /= double(reward_s.size());
    out.reward_sigma = std::sqrt(std::max(0.0, square / double(reward_s.size()) - mean * mean));
  }
  return out;
}

namespace {

std::vector<recorded_step> read_steps(const fs::path& file) {
  std::ifstream in(file);
  if (!in)
    throw std::runtime_error(file.string() + ": cannot be read; replay needs the run's metrics");
  std::vector<recorded_step> steps;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw std::runtime_error(fmt::format("{}:{}: not a JSON object", file.string(), number));
    auto event = j.value("event", "");
    if (event == "resume")
      throw std::runtime_error(file.string() +
                               ": the run was resumed, and its trace holds the last segment only; "
                               "replay a run that ran in one go");
    if (event != "step")
      continue;
    recorded_step s;
    s.version = j.value("version", int64_t{0});
    s.seconds = j.value("time_s", 0.0);
    s.samples = j.value("samples", int64_t{0});
    s.response_tokens = j.value("trained_tokens", int64_t{0});
    s.staleness_max = j.value("staleness_token_max", int64_t{0});
    s.response_mean = j.value("response_tokens_mean", 0.0);
    s.response_min = j.value("response_tokens_min", int64_t{0});
    s.response_max = j.value("response_tokens_max", int64_t{0});
    s.weight_sync_s = j.value("weight_sync_s", 0.0);
    steps.push_back(s);
  }
  if (steps.empty())
    throw std::runtime_error(file.string() + ": no step line: the run trained no step, so there is nothing to replay");
  return steps;
}

// Lengths of a log-normal fitted to the steps' mean, least and longest
// response: the spread from how far apart the extremes of a batch lie.
void fit_lengths(workload& work, const std::vector<recorded_step>& steps) {
  double mean = 0, spread = 0;
  int64_t n = 0;
  for (auto& s : steps) {
    if (s.samples < 2 || s.response_min < 1)
      continue;
    // The extremes of n normal draws lie about 2 sqrt(2 ln n) standard deviations apart.
    spread +=
        std::log(double(s.response_max) / double(s.response_min)) / (2 * std::sqrt(2 * std::log(double(s.samples))));
    mean += s.response_mean;
    n++;
  }
  if (n == 0)
    throw std::runtime_error("its steps say nothing of their response lengths");
  work.length_sigma = spread / double(n);
  work.length_median = std::max(1.0, mean / double(n) * std::exp(-0.5 * work.length_sigma * work.length_sigma));
  work.length_source = fmt::format(
      "log-normal fitted to the steps' response lengths (median {:.1f}, sigma {:.2f}; "
      "rl.record_trajectories was off)",
      work.length_median, work.length_sigma);
}

}  // namespace

recorded_run read_recorded_run(const fs::path& dir, const run_config& config) {
  recorded_run run;
  run.dir = dir;
  run.steps = read_steps(dir / "metrics.jsonl");
  auto trace_file = dir / "trace.json";
  std::ifstream in(trace_file);
  if (!in)
    throw std::runtime_error(trace_file.string() +
                             ": cannot be read; the run writes it when it ends, and replay "
                             "fits the run's costs to it");
  auto trace = json::parse(in, nullptr, false);
  try {
    if (trace.is_discarded())
      throw std::runtime_error("not JSON");
    run.costs = fit_trace(trace);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(trace_file.string() + ": " + e.what());
  }
  // Weights from the trainer to the engines: the median step's weight sync.
  std::vector<double> syncs;
  for (auto& s : run.steps)
    syncs.push_back(s.weight_sync_s);
  run.costs.rates.transfer = median(syncs);
  run.costs.rates.source = fmt::format(
      "fitted to {}'s trace: {} engine steps (R^2 {:.2f}) and {} training steps "
      "(R^2 {:.2f}); weights: the median step's weight sync in metrics.jsonl",
      dir.filename().string(), run.costs.engine.rows, run.costs.engine.r2, run.costs.trainer.rows,
      run.costs.trainer.r2);

  auto& work = run.work;
  work.max_new_tokens = config.rl.max_new_tokens;
  work.seed = config.run.seed;
  int64_t samples = 0, response = 0;
  for (auto& s : run.steps) {
    samples += s.samples;
    response += std::llround(s.response_mean * double(s.samples));
  }
  // The mean prompt: the sequences trained less their responses.
  double prompt = run.costs.trained_sequences > 0
                      ? (double(run.costs.trained_sequence_tokens) - double(response)) / double(samples)
                      : 1.0;
  work.prompt_tokens = std::max<int64_t>(1, std::llround(prompt));
  auto trajectories = dir / "trajectories.jsonl";
  if (fs::exists(trajectories)) {
    work.length_table = read_length_table(trajectories.string());
    work.length_source = "trajectories.jsonl of the run";
  } else {
    fit_lengths(work, run.steps);
  }
  work.reward_workers = std::max<int64_t>(1, config.reward.workers);
  if (run.costs.reward_checks > 0) {
    work.reward_median_s = run.costs.reward_median_s;
    work.reward_sigma = run.costs.reward_sigma;
  }
  run.notes = fmt::format(
      "prompts: {} tokens, the trained sequences' mean less the responses'\n"
      "responses: {}\n"
      "reward checks: median {:.3g} ms, sigma {:.2f} over the trace's {} checks; {} at once\n",
      work.prompt_tokens, work.length_source, work.reward_median_s * 1e3, work.reward_sigma, run.costs.reward_checks,
      work.reward_workers);
  return run;
}

sim_setup replay_setup(const recorded_run& run, const run_config& config) {
  auto& rl = config.rl;
  sim_setup s;
  // The fitted costs are the job's own, with whatever the engines and the
  // trainer cost each other on shared cores folded in: no sharing model on top.
  s.costs = std::make_shared<fitted_costs>(run.costs.rates);
  // One device per rollout engine of the run, and one for the trainer.
  auto engines = std::max<int64_t>(1, run.costs.engines);
  s.devices = engines + 1;
  s.generation_share = double(engines) / double(engines + 1);
  s.eta = rl.effective_eta();
  if (rl.batch_size % rl.group_size != 0)
    throw std::invalid_argument("rl.batch_size must be a multiple of rl.group_size");
  s.batch_prompts = rl.batch_size / rl.group_size;
  s.group_size = rl.group_size;
  s.steps = rl.steps;
  s.engine_slots = rl.rollout_slots;
  s.max_concurrent = rl.max_concurrent;
  if (rl.interruption == "wait")
    s.on_weights = interruption::wait;
  else if (rl.interruption == "reprefill")
    s.on_weights = interruption::reprefill;
  else
    throw std::invalid_argument("rl.interruption = \"" + rl.interruption +
                                "\" is not simulated; replay with --set rl.interruption='\"reprefill\"' or '\"wait\"'");
  s.shared_prompts = rl.prompt_pool_tokens > 0;
  s.work = run.work;
  s.keep_log = !config.simulate.log_path.empty();
  check_outputs(config.simulate);
  s.check();
  return s;
}

namespace {

// The recorded run's RL time at the end of step `i` (0-based), and the replay's.
struct compared_step {
  int64_t step = 0;
  double recorded = 0, replayed = 0;
};

double relative(double replayed, double recorded) {
  return recorded > 0 ? replayed / recorded - 1 : 0;
}

}  // namespace

int replay_command(const run_config& config, const fs::path& dir, const std::vector<std::string>& overrides,
                   std::ostream& out, std::ostream& err) {
  recorded_run run;
  sim_setup setup;
  try {
    run = read_recorded_run(dir, config);
    setup = replay_setup(run, config);
  } catch (const std::exception& e) {
    err << "areal simulate --replay: " << e.what() << "; nothing was simulated\n";
    return 2;
  }
  // Overrides of the simulation's own outputs ([simulate]) leave the run as it was.
  bool what_if = std::any_of(overrides.begin(), overrides.end(),
                             [](const std::string& o) { return o.rfind("simulate.", 0) != 0; });
  out << "areal simulate --replay " << dir.string() << ": the real controller in virtual time, with the costs "
      << "fitted to the run's own trace\n"
      << setup.costs->describe() << run.notes
      << fmt::format("run: {} engine(s) and a trainer, {} x {} answers per step, {} steps, eta {}{}\n", setup.engines(),
                     setup.batch_prompts, setup.group_size, setup.steps, setup.eta,
                     what_if ? "; overridden: the figures below are a what-if, not a check" : "");
  sim_result r;
  try {
    r = simulate_quietly(setup);
  } catch (const std::exception& e) {
    err << "areal simulate --replay: " << e.what() << "\n";
    return 1;
  }

  // Recorded against replayed, at a quarter, half, three quarters and all of the steps both ran.
  size_t common = std::min(run.steps.size(), r.trained.size());
  std::vector<compared_step> marks;
  for (size_t q = 1; q <= 4 && common > 0; ++q) {
    size_t i = std::max<size_t>(1, common * q / 4) - 1;
    if (marks.empty() || marks.back().step != int64_t(i + 1))
      marks.push_back({int64_t(i + 1), run.steps[i].seconds, r.trained[i].seconds});
  }
  auto mean_max_staleness = [&](auto get, size_t n) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i)
      sum += double(get(i));
    return n > 0 ? sum / double(n) : 0.0;
  };
  double recorded_staleness = mean_max_staleness([&](size_t i) { return run.steps[i].staleness_max; }, common);
  double replayed_staleness = mean_max_staleness([&](size_t i) { return r.trained[i].max_staleness; }, common);
  double recorded_s = common > 0 ? run.steps[common - 1].seconds : 0;
  double replayed_s = common > 0 ? r.trained[common - 1].seconds : 0;
  double engine_busy = recorded_s > 0 ? run.costs.generate_seconds / (recorded_s * double(setup.engines())) : 0;
  double trainer_busy = recorded_s > 0 ? run.costs.train_seconds / recorded_s : 0;

  out << fmt::format("{:<34} {:>10} {:>10} {:>8}\n", "", "recorded", what_if ? "what-if" : "replayed",
                     what_if ? "change" : "error");
  for (auto& m : marks)
    out << fmt::format("{:<34} {:>10.2f} {:>10.2f} {:>+7.1f}%\n", fmt::format("seconds to step {}", m.step), m.recorded,
                       m.replayed, 100 * relative(m.replayed, m.recorded));
  out << fmt::format("{:<34} {:>10.2f} {:>10.2f} {:>+7.1f}%\n", "max staleness per step, mean", recorded_staleness,
                     replayed_staleness, 100 * relative(replayed_staleness, recorded_staleness));
  out << fmt::format("{:<34} {:>9.1f}% {:>9.1f}%\n", "engines busy", 100 * engine_busy, 100 * r.engine_busy_share);
  out << fmt::format("{:<34} {:>9.1f}% {:>9.1f}%\n", "trainer busy", 100 * trainer_busy, 100 * r.trainer_busy_share);
  out << fmt::format(
      "replayed {} steps in {:.1f} s of virtual time ({}{}); simulated in {:.2f} s; schedule hash "
      "{:016x}\n",
      r.steps, r.virtual_seconds, r.exit_code == 0 ? "" : "FAILED: ", r.end_reason, r.wall_seconds, r.schedule_hash);
  if (run.steps.size() != r.trained.size())
    out << fmt::format("the run recorded {} steps and the replay ran {}: compared over the first {}\n",
                       run.steps.size(), r.trained.size(), common);

  auto& c = config.simulate;
  bool written = true;
  if (!c.log_path.empty())
    written = write_output(c.log_path, r.schedule_log, "schedule log", out, err) && written;
  if (!c.json_path.empty()) {
    json steps = json::array();
    for (size_t i = 0; i < common; ++i)
      steps.push_back({{"step", i + 1},
                       {"recorded_s", run.steps[i].seconds},
                       {"replayed_s", r.trained[i].seconds},
                       {"recorded_max_staleness", run.steps[i].staleness_max},
                       {"replayed_max_staleness", r.trained[i].max_staleness}});
    json j = {{"run", dir.string()},
              {"what_if", what_if},
              {"overrides", overrides},
              {"cost_model", setup.costs->describe()},
              {"engine_fit_r2", run.costs.engine.r2},
              {"trainer_fit_r2", run.costs.trainer.r2},
              {"recorded_s", recorded_s},
              {"replayed_s", replayed_s},
              {"error", relative(replayed_s, recorded_s)},
              {"recorded_max_staleness_mean", recorded_staleness},
              {"replayed_max_staleness_mean", replayed_staleness},
              {"recorded_engine_busy", engine_busy},
              {"replayed_engine_busy", r.engine_busy_share},
              {"recorded_trainer_busy", trainer_busy},
              {"replayed_trainer_busy", r.trainer_busy_share},
              {"schedule_hash", fmt::format("{:016x}", r.schedule_hash)},
              {"steps", steps}};
    written = write_output(c.json_path, j.dump(2) + "\n", "result JSON", out, err) && written;
  }
  return r.exit_code == 0 && written ? 0 : 1;
}

}  // namespace areal::sim
