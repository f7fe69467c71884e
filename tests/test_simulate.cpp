// Virtual-time runs of the real controller (areal/sim): exactly repeatable,
// the staleness bound holds, interruption and waiting do what they say, the
// cost formulas match their definitions, and bad setups are refused.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "areal/runtime/config.hpp"
#include "areal/sim/simulate_command.hpp"
#include "areal/sim/simulation.hpp"

using namespace areal::sim;

namespace {

// A small run: 8 devices (6 generating), 4 prompts x 4 answers per step, a
// long tail of lengths, costs linear in the work.
sim_setup small_setup() {
  measured_rates r;
  r.decode_base = 0.01;
  r.decode_per_sequence = 0.001;
  r.decode_per_context = 1e-6;
  r.prefill_per_token = 1e-5;
  r.train_base = 0.05;
  r.train_per_token = 1e-4;
  r.transfer = 0.02;
  r.source = "test rates";
  sim_setup s;
  s.costs = std::make_shared<fitted_costs>(r);
  s.devices = 8;
  s.batch_prompts = 4;
  s.group_size = 4;
  s.steps = 12;
  s.eta = 2;
  s.engine_slots = 8;
  s.work.prompt_tokens = 16;
  s.work.max_new_tokens = 400;
  s.work.length_median = 60;
  s.work.length_sigma = 1.0;
  s.work.reward_workers = 2;
  s.work.reward_median_s = 0.01;
  return s;
}

// The versions each completed sample's tokens carry, from the log's "done" lines.
std::vector<std::string> version_runs(const std::string& log) {
  std::vector<std::string> out;
  std::regex done{R"(done \d+\.\d+ \S+ tokens=\d+ versions=(\S*))"};
  for (std::sregex_iterator it{log.begin(), log.end(), done}, end; it != end; ++it)
    out.push_back((*it)[1]);
  return out;
}

}  // namespace

TEST_CASE("a simulated run trains its steps and is exactly repeatable") {
  auto setup = small_setup();
  auto a = simulate(setup);
  CHECK(a.exit_code == 0);
  CHECK(a.steps == setup.steps);
  CHECK(a.trained_samples == setup.steps * setup.batch_prompts * setup.group_size);
  CHECK(a.virtual_seconds > 0);
  CHECK(a.engine_busy_share > 0);
  CHECK(a.engine_busy_share <= 1.0);
  // Every trained response token was generated; a simulated engine that generated nothing would leave none.
  CHECK(a.trained_response_tokens > 0);
  CHECK(a.generated_tokens >= a.trained_response_tokens);
  CHECK(!a.schedule_log.empty());
  auto b = simulate(setup);
  CHECK(a.schedule_log == b.schedule_log);
  CHECK(a.schedule_hash == b.schedule_hash);
  CHECK(a.virtual_seconds == b.virtual_seconds);
  setup.work.seed = 2;
  auto c = simulate(setup);
  CHECK(c.schedule_hash != a.schedule_hash);
}

TEST_CASE("the staleness bound of the real controller holds in virtual time") {
  auto setup = small_setup();
  setup.eta = 0;
  auto sync = simulate(setup);
  CHECK(sync.max_staleness == 0);
  setup.eta = 1;
  auto bounded = simulate(setup);
  CHECK(bounded.max_staleness <= 1);
  setup.eta = -1;  // unbounded: with 6 engines of 8 slots, far more than a batch is in flight
  auto unbounded = simulate(setup);
  CHECK(unbounded.max_staleness > 1);
  // More samples in flight keep the engines busier and finish sooner.
  CHECK(bounded.virtual_seconds < sync.virtual_seconds);
  CHECK(bounded.engine_busy_share > sync.engine_busy_share);
  // Synchronous: every sample is admitted once its weights reached the engines (the controller hears
  // of each version's delivery), so none is stale when trained; one version ahead, the long tail
  // completes some groups after their deadline, and the controller drops them.
  MESSAGE("scored samples dropped: sync " << sync.dropped_samples << ", eta 1 " << bounded.dropped_samples);
  CHECK(sync.dropped_samples == 0);
  CHECK(bounded.dropped_samples > 0);
}

TEST_CASE("new weights interrupt sequences in flight, or wait for them") {
  auto setup = small_setup();
  setup.eta = 4;
  setup.on_weights = interruption::reprefill;
  auto interrupted = simulate(setup);
  CHECK(interrupted.interruptions > 0);
  CHECK(interrupted.reprefill_share > 0);
  int spanning = 0;
  for (auto& runs : version_runs(interrupted.schedule_log))
    spanning += runs.find(',') != std::string::npos ? 1 : 0;
  CHECK(spanning > 0);  // some samples' tokens come from two policy versions

  setup.on_weights = interruption::wait;
  auto waited = simulate(setup);
  CHECK(waited.interruptions == 0);
  CHECK(waited.reprefill_share == 0);
  auto runs = version_runs(waited.schedule_log);
  CHECK(runs.size() >= static_cast<size_t>(waited.trained_samples));
  for (auto& r : runs)
    CHECK_MESSAGE(r.find(',') == std::string::npos, "a waiting engine mixed versions in one sequence: " << r);
}

TEST_CASE("the answers of a group on one engine compute their prompt once") {
  auto setup = small_setup();
  setup.devices = 2;  // one engine: every answer of a group meets its siblings there
  setup.generation_share = 0.5;
  setup.on_weights = interruption::wait;  // no re-prefill: every prefill is a fresh prompt
  setup.shared_prompts = false;
  auto alone = simulate(setup);
  auto answers = static_cast<int64_t>(version_runs(alone.schedule_log).size());
  // Every answer's prompt, those still in flight at the end too (at most a slot each).
  CHECK(alone.prefill_tokens % setup.work.prompt_tokens == 0);
  CHECK(alone.prefill_tokens >= answers * setup.work.prompt_tokens);
  CHECK(alone.prefill_tokens <= (answers + setup.engine_slots) * setup.work.prompt_tokens);
  setup.shared_prompts = true;
  auto shared = simulate(setup);
  auto shared_answers = static_cast<int64_t>(version_runs(shared.schedule_log).size());
  CHECK(shared.prefill_tokens % setup.work.prompt_tokens == 0);
  CHECK(shared.prefill_tokens >= shared_answers / setup.group_size * setup.work.prompt_tokens);
  CHECK(shared.prefill_tokens * 2 < shared_answers * setup.work.prompt_tokens);
  CHECK(shared.virtual_seconds < alone.virtual_seconds);
}

TEST_CASE("a colocated synchronous run uses every device for both phases") {
  auto setup = small_setup();
  setup.colocated = true;
  setup.eta = 0;
  CHECK(setup.engines() == 8);
  CHECK(setup.trainer_devices() == 8);
  auto r = simulate(setup);
  CHECK(r.steps == setup.steps);
  CHECK(r.max_staleness == 0);
  setup.colocated = false;
  CHECK(setup.engines() == 6);
  CHECK(setup.trainer_devices() == 2);
}

TEST_CASE("bad simulation setups are refused with what to change") {
  auto setup = small_setup();
  setup.colocated = true;
  setup.eta = 2;
  CHECK_THROWS_WITH_AS(simulate(setup), doctest::Contains("set eta = 0"), std::invalid_argument);
  setup = small_setup();
  setup.generation_share = 1.0;
  CHECK_THROWS_WITH_AS(simulate(setup), doctest::Contains("generation_share"), std::invalid_argument);
  setup = small_setup();
  setup.costs = nullptr;
  CHECK_THROWS_AS(simulate(setup), std::invalid_argument);
  CHECK_THROWS_WITH_AS(qwen2_shape("qwen2-3b"), doctest::Contains("qwen2-1.5b"), std::invalid_argument);
  auto huge = qwen2_shape("qwen2-32b");
  huge.tensor_parallel = 1;  // 65 GB of weights on one 80 GB H800 leaves room for a few sequences only
  sim_setup s = small_setup();
  s.costs = std::make_shared<roofline_costs>(huge, gpu_device("h800"));
  s.work.prompt_tokens = 1000;
  s.work.max_new_tokens = 32000;
  s.work.length_median = 30000;
  s.work.length_sigma = 0.01;
  s.engine_slots = 0;
  CHECK(s.slots_per_engine() < 5);
}

TEST_CASE("the roofline follows its formulas on the Qwen2 shapes") {
  auto& small = qwen2_shape("qwen2-1.5b");
  CHECK(small.parameters() == doctest::Approx(1.54e9).epsilon(0.01));
  CHECK(qwen2_shape("qwen2-7b").parameters() == doctest::Approx(7.62e9).epsilon(0.01));
  CHECK(qwen2_shape("qwen2-32b").parameters() == doctest::Approx(32.8e9).epsilon(0.01));
  CHECK(small.kv_bytes_per_token(2) == 28672);  // 2 x 28 layers x 2 heads x 128 x 2 bytes
  auto device = gpu_device("h800");
  roofline_costs costs{small, device};
  // Batch 1, empty context: reading the weights bounds the step.
  double weights = small.parameters() * 2;
  CHECK(costs.decode_step_seconds(1, 0) ==
        doctest::Approx(weights / device.memory_bandwidth.value + device.step_overhead.value));
  // A large batch is bound by FLOPs.
  double flops = 4096 * small.forward_flops_per_token();
  CHECK(costs.decode_step_seconds(4096, 0) ==
        doctest::Approx(flops / device.flop_rate.value + device.step_overhead.value));
  // Reading the KV cache grows the step with the context.
  CHECK(costs.decode_step_seconds(64, 1e6) > costs.decode_step_seconds(64, 1e5));
  CHECK(costs.train_seconds({1000, 1000}, 2) == doctest::Approx(costs.train_seconds({1000, 1000, 1000, 1000}, 4)));
  CHECK(costs.describe().find("source:") != std::string::npos);
}

TEST_CASE("a non-negative least-squares fit recovers linear costs") {
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (int b = 1; b <= 8; ++b)
    for (int c = 0; c < 4; ++c) {
      x.push_back({1.0, double(b), double(c * 100)});
      y.push_back(0.5 + 0.25 * b + 0.001 * c * 100);
    }
  auto beta = fit_nonnegative(x, y);
  REQUIRE(beta.size() == 3);
  CHECK(beta[0] == doctest::Approx(0.5));
  CHECK(beta[1] == doctest::Approx(0.25));
  CHECK(beta[2] == doctest::Approx(0.001));
  // A falling cost is not a cost: that column comes out 0 and the others absorb it.
  for (auto& v : y)
    v = 2.0;
  for (size_t i = 0; i < y.size(); ++i)
    y[i] -= 0.01 * x[i][1];
  beta = fit_nonnegative(x, y);
  CHECK(beta[1] == 0.0);
}

TEST_CASE("response lengths follow the workload and a length table") {
  workload w;
  w.max_new_tokens = 1000;
  w.length_median = 300;
  w.length_sigma = 0.5;
  std::vector<int64_t> draws;
  for (uint32_t i = 0; i < 2000; ++i)
    draws.push_back(w.response_tokens(i, i % 16));
  std::sort(draws.begin(), draws.end());
  CHECK(draws[1000] == doctest::Approx(300).epsilon(0.1));
  CHECK(draws.back() <= 1000);
  CHECK(w.response_tokens(7, 3) == w.response_tokens(7, 3));
  w.length_table = {5, 9};
  std::set<int64_t> seen;
  for (uint32_t i = 0; i < 100; ++i)
    seen.insert(w.response_tokens(i, 0));
  CHECK(seen == std::set<int64_t>{5, 9});
}

TEST_CASE("a length table is read from a list or from a run's trajectories.jsonl, and bad lines are named") {
  auto dir = std::filesystem::temp_directory_path() / ("areal-lengths-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "lengths.txt") << "# lengths of a run\n12\n\n30 3  # three of them\n";
  CHECK(read_length_table((dir / "lengths.txt").string()) == std::vector<int64_t>{12, 30, 30, 30});
  std::ofstream(dir / "trajectories.jsonl") << R"({"group":0,"index":0,"output_tokens":[5,6,7]})"
                                            << "\n"
                                            << R"({"group":0,"index":1,"output_tokens":[9]})"
                                            << "\n";
  CHECK(read_length_table((dir / "trajectories.jsonl").string()) == std::vector<int64_t>{3, 1});
  std::ofstream(dir / "bad.txt") << "12\nlong\n";
  CHECK_THROWS_WITH_AS(read_length_table((dir / "bad.txt").string()), doctest::Contains("bad.txt:2"),
                       std::runtime_error);
  std::ofstream(dir / "bad.jsonl") << "{\"tokens\": 3}\n";
  CHECK_THROWS_WITH_AS(read_length_table((dir / "bad.jsonl").string()), doctest::Contains("output_tokens"),
                       std::runtime_error);
  CHECK_THROWS_AS(read_length_table((dir / "missing.txt").string()), std::runtime_error);
  std::filesystem::remove_all(dir);
}

namespace {

const char* small_config = R"(
[run]
seed = 5
[rl]
steps = 3
eta = 2
group_size = 4
batch_size = 32
max_new_tokens = 2000
[simulate]
device = "h200"
model = "qwen2-7b"
devices = 16
length_median = 300
reward_workers = 16
[[nodes]]
name = "local"
roles = ["controller", "trainer", "rollout", "reward"]
)";

areal::run_config parse(const std::vector<std::string>& overrides = {}) {
  auto r = areal::parse_config(small_config, "sim.toml", overrides);
  REQUIRE_MESSAGE(r.config, (r.errors.empty() ? "" : r.errors.front()));
  return *r.config;
}

}  // namespace

TEST_CASE("areal simulate reads its run from [rl] and [simulate]") {
  auto s = setup_from(parse());
  CHECK(s.steps == 3);
  CHECK(s.eta == 2);
  CHECK(s.group_size == 4);
  CHECK(s.batch_prompts == 8);
  CHECK(s.work.max_new_tokens == 2000);
  CHECK(s.work.length_median == 300);
  CHECK(s.work.seed == 5);
  CHECK(s.devices == 16);
  CHECK(s.engines() == 12);
  CHECK(s.costs->describe().find("H200") != std::string::npos);
  CHECK(s.costs->describe().find("qwen2-7b") != std::string::npos);
  CHECK(setup_from(parse({"rl.mode=\"sync\""})).eta == 0);
  CHECK(setup_from(parse({"rl.interruption=\"wait\""})).on_weights == interruption::wait);
  CHECK(setup_from(parse({"simulate.step_overhead_s=0.01"})).costs->decode_step_seconds(1, 0) >
        setup_from(parse()).costs->decode_step_seconds(1, 0) + 0.007);
  CHECK_THROWS_WITH_AS(setup_from(parse({"rl.interruption=\"keep_cache\""})), doctest::Contains("reprefill"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(setup_from(parse({"simulate.colocated=true"})), doctest::Contains("rl.mode"),
                       std::invalid_argument);
  auto colocated = setup_from(parse({"simulate.colocated=true", "rl.mode=\"sync\""}));
  CHECK(colocated.colocated);
  CHECK(colocated.engines() == 16);
}

TEST_CASE("areal simulate prints its result and writes the JSON and schedule log it is asked for") {
  auto json = std::filesystem::temp_directory_path() / ("areal-sim-" + std::to_string(::getpid()) + ".json");
  auto log = json;
  log.replace_extension(".log");
  auto config = parse({"simulate.json=\"" + json.string() + "\"", "simulate.log=\"" + log.string() + "\""});
  std::ostringstream out, err;
  CHECK(simulate_command(config, out, err) == 0);
  CHECK_MESSAGE(out.str().find("result: 3 steps") != std::string::npos, out.str());
  std::ifstream j(json);
  std::string text((std::istreambuf_iterator<char>(j)), {});
  CHECK(text.find("\"steady_tokens_per_s\"") != std::string::npos);
  CHECK(text.find("\"generated_tokens\"") != std::string::npos);
  CHECK(text.find("\"dropped_samples\"") != std::string::npos);
  CHECK_MESSAGE(out.str().find("scored samples dropped") != std::string::npos, out.str());
  CHECK_MESSAGE(out.str().find("response tokens generated") != std::string::npos, out.str());
  std::ifstream l(log);
  std::string first;
  std::getline(l, first);
  CHECK(first.find("dispatch") != std::string::npos);
  std::filesystem::remove(json);
  std::filesystem::remove(log);
  // A configuration it cannot simulate: exit code 2 and the reason.
  std::ostringstream out2, err2;
  CHECK(simulate_command(parse({"rl.interruption=\"keep_cache\""}), out2, err2) == 2);
  CHECK(err2.str().find("nothing was simulated") != std::string::npos);
  // An output it could not write: refused before simulating (it wrote nothing and said "result JSON: ..." before).
  auto nowhere = json.parent_path() / ("areal-sim-missing-" + std::to_string(::getpid())) / "result.json";
  std::ostringstream out3, err3;
  CHECK(simulate_command(parse({"simulate.json=\"" + nowhere.string() + "\""}), out3, err3) == 2);
  CHECK_MESSAGE(
      err3.str().find("simulate.json = \"" + nowhere.string() + "\": there is no folder") != std::string::npos,
      err3.str());
  CHECK(out3.str().find("result:") == std::string::npos);
  std::ostringstream out4, err4;
  CHECK(simulate_command(parse({"simulate.log=\"" + json.parent_path().string() + "\""}), out4, err4) == 2);
  CHECK_MESSAGE(err4.str().find("is a folder; name a file") != std::string::npos, err4.str());
  // Written whole or reported: a file the system refuses fails the command with the reason.
  std::ostringstream out5, err5;
  CHECK(simulate_command(parse({"simulate.json=\"/proc/areal-sim.json\""}), out5, err5) == 1);
  CHECK_MESSAGE(err5.str().find("the result JSON was not written: /proc/areal-sim.json") != std::string::npos,
                err5.str());
  CHECK(out5.str().find("result JSON:") == std::string::npos);
}

TEST_CASE("on one node's shared cores the engine and the trainer slow each other only while both compute") {
  auto setup = small_setup();
  setup.devices = 2;  // one engine and the trainer
  setup.generation_share = 0.5;
  auto alone = dynamic_cast<const fitted_costs&>(*setup.costs).rates();
  auto slower = alone;  // every cost twice as high while the other side computes
  for (auto* x : {&slower.decode_base, &slower.decode_per_sequence, &slower.decode_per_context,
                  &slower.prefill_per_token, &slower.train_base, &slower.train_per_token})
    *x *= 2;
  auto own_cores = simulate(setup);
  setup.costs = std::make_shared<fitted_costs>(alone, slower);
  auto shared = simulate(setup);
  setup.costs = std::make_shared<fitted_costs>(slower);
  auto always_slow = simulate(setup);
  REQUIRE(shared.steps == setup.steps);
  CHECK(shared.virtual_seconds > own_cores.virtual_seconds * 1.05);    // they slowed each other...
  CHECK(shared.virtual_seconds < always_slow.virtual_seconds * 0.95);  // ...only while both computed
  // Synchronous: generation and training alternate, never computing together.
  setup.colocated = true;
  setup.eta = 0;
  setup.devices = 1;
  setup.costs = std::make_shared<fitted_costs>(alone);
  auto sync_own = simulate(setup);
  setup.costs = std::make_shared<fitted_costs>(alone, slower);
  auto sync_shared = simulate(setup);
  CHECK(sync_shared.virtual_seconds == sync_own.virtual_seconds);
  CHECK(sync_shared.schedule_hash == sync_own.schedule_hash);
}

TEST_CASE("one-thread members on fewer cores than they are run at the cores' share while they outnumber them") {
  auto setup = small_setup();
  setup.devices = 3;  // two engines and the trainer, one thread each
  setup.generation_share = 2.0 / 3.0;
  REQUIRE(setup.engines() == 2);
  auto own_cores = simulate(setup);
  setup.shared_cores = 3;  // a core for each: nobody waits
  auto enough = simulate(setup);
  CHECK(enough.virtual_seconds == own_cores.virtual_seconds);
  CHECK(enough.schedule_hash == own_cores.schedule_hash);
  setup.shared_cores = 2;
  auto two = simulate(setup);
  setup.shared_cores = 1;
  auto one = simulate(setup);
  REQUIRE(two.steps == setup.steps);
  REQUIRE(one.steps == setup.steps);
  // The engines compute nearly all the time and the trainer a tenth of it: on two cores the three slow
  // each other only while the trainer computes; on one the two engines halve each other's speed.
  REQUIRE(own_cores.engine_busy_share > 0.9);
  REQUIRE(own_cores.trainer_busy_share < 0.2);
  CHECK(two.virtual_seconds > own_cores.virtual_seconds * 1.02);
  CHECK(one.virtual_seconds > own_cores.virtual_seconds * 1.9);
  // Three on two cores are at worst 1.5x slower, and only while all three compute.
  auto alone = dynamic_cast<const fitted_costs&>(*setup.costs).rates();
  auto slower = alone;
  for (auto* x : {&slower.decode_base, &slower.decode_per_sequence, &slower.decode_per_context,
                  &slower.prefill_per_token, &slower.train_base, &slower.train_per_token})
    *x *= 1.5;
  setup.shared_cores = 0;
  setup.costs = std::make_shared<fitted_costs>(slower);
  auto always_slow = simulate(setup);
  CHECK(two.virtual_seconds < always_slow.virtual_seconds * 0.98);
  // One core, never idle: the run lasts as long as all the members' work done one after the other, also
  // when the engines go idle at different times (eta 0: each drains its share of a batch, then waits), which
  // speeds up the one still computing.
  auto work_of = [](const sim_result& r) {
    return r.virtual_seconds * (2 * r.engine_busy_share + r.trainer_busy_share);
  };
  CHECK(one.virtual_seconds == doctest::Approx(work_of(own_cores)).epsilon(0.01));
  auto in_turns = small_setup();
  in_turns.devices = 3;
  in_turns.generation_share = 2.0 / 3.0;
  in_turns.eta = 0;
  in_turns.work.reward_median_s = 1e-4;
  auto in_turns_own = simulate(in_turns);
  in_turns.shared_cores = 1;
  auto in_turns_one = simulate(in_turns);
  CHECK(in_turns_one.virtual_seconds == doctest::Approx(work_of(in_turns_own)).epsilon(0.01));

  setup.costs = std::make_shared<fitted_costs>(alone);
  setup.shared_cores = -1;
  CHECK_THROWS_WITH_AS(simulate(setup), doctest::Contains("shared_cores must be"), std::invalid_argument);
}
