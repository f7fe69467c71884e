// Replaying a finished run in virtual time (areal/sim/replay.hpp): a trace's
// spans are fitted to the cost model's terms, and a run directory whose records
// come from a known simulated run is replayed into that same run.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "areal/runtime/cli.hpp"
#include "areal/runtime/config.hpp"
#include "areal/sim/replay.hpp"

using namespace areal::sim;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

measured_rates known_rates() {
  measured_rates r;
  r.decode_base = 0.004;
  r.decode_per_sequence = 0.0005;
  r.decode_per_context = 2e-6;
  r.prefill_per_token = 3e-5;
  r.prefill_per_attended = 4e-8;
  r.train_base = 0.03;
  r.train_per_token = 2e-4;
  r.train_per_attended = 1e-7;
  r.transfer = 0.006;
  return r;
}

// Spans whose durations follow the rates exactly: engine steps on `engines`
// tracks with varied batches, contexts and prefills; training steps of
// `steps` batches (their tokens: samples x prompt + the step's responses);
// reward checks of `reward_s` each.
json trace_of(const measured_rates& r, int engines, const std::vector<int64_t>& step_responses, int64_t samples,
              int64_t prompt, double reward_s) {
  json events = json::array();
  for (int e = 0; e < engines; ++e)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", e + 1},
                      {"args", {{"name", "rollout-" + std::to_string(e)}}}});
  for (int i = 0; i < 60; ++i) {
    double batch = 1 + i % 13, context = batch * (20 + 7 * (i % 5)), prefill = (i % 4 == 0) ? 16.0 * (1 + i % 3) : 0;
    double attended = prefill * (prefill + 1) / 2 + prefill * (i % 7);
    double seconds = r.decode_base + r.decode_per_sequence * batch + r.decode_per_context * context +
                     r.prefill_per_token * prefill + r.prefill_per_attended * attended;
    events.push_back(
        {{"name", "generate"},
         {"ph", "X"},
         {"pid", 1},
         {"tid", 1 + i % engines},
         {"ts", i * 1e4},
         {"dur", seconds * 1e6},
         {"args", {{"batch", batch}, {"context", context}, {"prefill", prefill}, {"attended", attended}}}});
  }
  for (size_t k = 0; k < step_responses.size(); ++k) {
    // Sequences of equal length: tokens and attended positions follow from it.
    double length = double(prompt) + double(step_responses[k]) / double(samples);
    double tokens = length * double(samples), attended = double(samples) * length * (length + 1) / 2;
    double seconds = r.train_base + r.train_per_token * tokens + r.train_per_attended * attended;
    events.push_back({{"name", "train"},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", engines + 1},
                      {"ts", 1e6 + double(k) * 1e5},
                      {"dur", seconds * 1e6},
                      {"args", {{"sequences", samples}, {"tokens", tokens}, {"attended", attended}}}});
  }
  for (int i = 0; i < 9; ++i)
    events.push_back(
        {{"name", "reward"}, {"ph", "X"}, {"pid", 1}, {"tid", engines + 2}, {"ts", i * 1e3}, {"dur", reward_s * 1e6}});
  return {{"traceEvents", events}};
}

const char* run_toml = R"(
[run]
seed = 3
[rl]
steps = 10
eta = 2
group_size = 4
batch_size = 16
max_new_tokens = 64
rollout_slots = 12
max_concurrent = 24
[reward]
workers = 3
[[nodes]]
name = "local"
roles = ["controller", "trainer", "rollout", "reward"]
)";

areal::run_config parse(const std::vector<std::string>& overrides = {}) {
  auto r = areal::parse_config(run_toml, "run.toml", overrides);
  REQUIRE_MESSAGE(r.config, (r.errors.empty() ? "" : r.errors.front()));
  return *r.config;
}

struct scratch_dir {
  fs::path path = fs::temp_directory_path() / ("areal-replay-" + std::to_string(::getpid()));
  scratch_dir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("a trace's spans are fitted to the cost model's terms") {
  auto r = known_rates();
  auto fit = fit_trace(trace_of(r, 2, {40, 48, 56}, 8, 10, 0.002));
  CHECK(fit.engines == 2);
  CHECK(fit.engine.rows == 60);
  CHECK(fit.engine.r2 == doctest::Approx(1.0).epsilon(1e-9));
  CHECK(fit.rates.decode_base == doctest::Approx(r.decode_base).epsilon(1e-6));
  CHECK(fit.rates.decode_per_sequence == doctest::Approx(r.decode_per_sequence).epsilon(1e-6));
  CHECK(fit.rates.decode_per_context == doctest::Approx(r.decode_per_context).epsilon(1e-6));
  CHECK(fit.rates.prefill_per_token == doctest::Approx(r.prefill_per_token).epsilon(1e-6));
  CHECK(fit.rates.prefill_per_attended == doctest::Approx(r.prefill_per_attended).epsilon(1e-6));
  CHECK(fit.trainer.rows == 3);
  CHECK(fit.rates.train_base + fit.rates.train_per_token * 1000 + fit.rates.train_per_attended * 60000 ==
        doctest::Approx(r.train_base + r.train_per_token * 1000 + r.train_per_attended * 60000).epsilon(1e-6));
  CHECK(fit.trained_sequences == 24);
  CHECK(fit.reward_checks == 9);
  CHECK(fit.reward_median_s == doctest::Approx(0.002));
  CHECK(fit.reward_sigma == doctest::Approx(0.0).epsilon(1e-6));
}

TEST_CASE("a trace without what its engine steps computed is refused with the reason") {
  auto trace = trace_of(known_rates(), 1, {40, 48}, 8, 10, 0.002);
  for (auto& e : trace["traceEvents"])
    if (e.value("name", "") == "generate")
      e.erase("args");
  CHECK_THROWS_WITH_AS(fit_trace(trace), doctest::Contains("older areal"), std::runtime_error);
  CHECK_THROWS_WITH_AS(fit_trace(json::object()), doctest::Contains("traceEvents"), std::runtime_error);
}

TEST_CASE("a run directory recorded from a known run is replayed into that run") {
  // The "real" run: simulated with known costs, workload and configuration.
  auto config = parse();
  auto rates = known_rates();
  std::vector<int64_t> lengths = {3, 9, 14, 22, 30, 41, 64, 7, 12};
  sim_setup original;
  original.costs = std::make_shared<fitted_costs>(rates);
  original.devices = 3;  // two engines and a trainer, as replay reads them from the trace
  original.generation_share = 2.0 / 3.0;
  original.eta = 2;
  original.batch_prompts = 4;
  original.group_size = 4;
  original.steps = 10;
  original.engine_slots = 12;
  original.max_concurrent = 24;
  original.work.prompt_tokens = 10;
  original.work.max_new_tokens = 64;
  original.work.length_table = lengths;
  original.work.reward_median_s = 0.002;
  original.work.reward_sigma = 0;
  original.work.reward_workers = 3;
  original.work.seed = 3;
  auto truth = simulate(original);
  REQUIRE(truth.steps == 10);

  // Its records, in the files a run writes.
  scratch_dir dir;
  std::vector<int64_t> step_responses;
  {
    std::ofstream metrics(dir.path / "metrics.jsonl");
    metrics << json{{"event", "eval"}, {"time_s", 0.0}, {"version", 0}}.dump() << "\n";
    for (auto& p : truth.trained) {
      int64_t responses = p.tokens - p.samples * 10;  // trained tokens count prompts too
      step_responses.push_back(responses);
      metrics << json{{"event", "step"},
                      {"version", p.version},
                      {"time_s", p.seconds},
                      {"samples", p.samples},
                      {"trained_tokens", responses},
                      {"response_tokens_mean", double(responses) / double(p.samples)},
                      {"response_tokens_min", 3},
                      {"response_tokens_max", 64},
                      {"staleness_token_max", p.max_staleness},
                      {"weight_sync_s", rates.transfer}}
                     .dump()
              << "\n";
    }
    std::ofstream(dir.path / "trace.json") << trace_of(rates, 2, step_responses, 16, 10, 0.002).dump();
    std::ofstream trajectories(dir.path / "trajectories.jsonl");
    for (auto n : lengths)
      trajectories
          << json{{"prompt_tokens", std::vector<int>(10, 1)}, {"output_tokens", std::vector<int>(size_t(n), 1)}}.dump()
          << "\n";
  }

  auto run = read_recorded_run(dir.path, config);
  CHECK(run.steps.size() == 10);
  CHECK(run.work.prompt_tokens == 10);
  CHECK(run.work.length_table.size() == lengths.size());
  CHECK(run.costs.rates.transfer == doctest::Approx(rates.transfer));
  auto replayed = simulate(replay_setup(run, config));
  REQUIRE(replayed.trained.size() == truth.trained.size());
  for (size_t i = 0; i < truth.trained.size(); ++i) {
    CHECK(replayed.trained[i].seconds == doctest::Approx(truth.trained[i].seconds).epsilon(1e-6));
    CHECK(replayed.trained[i].max_staleness == truth.trained[i].max_staleness);
  }

  // The command: the recorded and replayed schedule side by side, and the JSON.
  auto json_path = dir.path / "replay.json";
  std::ostringstream out, err;
  CHECK(replay_command(parse({"simulate.json=\"" + json_path.string() + "\""}), dir.path, {}, out, err) == 0);
  CHECK_MESSAGE(out.str().find("seconds to step 10") != std::string::npos, out.str());
  CHECK(out.str().find("what-if") == std::string::npos);
  std::ifstream j(json_path);
  auto written = json::parse(j);
  CHECK(written["steps"].size() == 10);
  CHECK(std::abs(written["error"].get<double>()) < 1e-6);
  // A what-if: another bound, the same fitted costs.
  std::ostringstream out2, err2;
  CHECK(replay_command(parse({"rl.eta=0"}), dir.path, {"rl.eta=0"}, out2, err2) == 0);
  CHECK(out2.str().find("what-if") != std::string::npos);
  // A directory that is no run: exit 2 and what is missing.
  std::ostringstream out3, err3;
  CHECK(replay_command(config, dir.path / "nothing", {}, out3, err3) == 2);
  CHECK(err3.str().find("metrics.jsonl") != std::string::npos);
}

TEST_CASE("--replay goes with simulate and reads the run's own configuration") {
  auto parse_args = [](std::vector<const char*> args) {
    args.insert(args.begin(), "areal");
    return areal::parse_cli(static_cast<int>(args.size()), args.data());
  };
  auto ok = parse_args({"simulate", "--replay", "/runs/a", "--set", "rl.eta=4"});
  REQUIRE(ok.options);
  CHECK(ok.options->replay_dir == "/runs/a");
  CHECK(ok.options->config_path == "/runs/a/config.toml");
  CHECK(parse_args({"--replay", "/runs/a"}).error.find("goes with simulate") != std::string::npos);
  CHECK(parse_args({"simulate", "--replay", "/runs/a", "--config", "x.toml"}).error.find("leave out --config") !=
        std::string::npos);
}
