// bench_simulate: the paper's claims in their regime, by virtual-time runs of
// the real controller (areal/sim/simulation.hpp) with simulated GPU members.
//   (a) async vs sync end to end in the setup of the paper's Table 1 (16 nodes
//       x 8 H800, three quarters generating, 512 prompts x 16 answers per step,
//       answers up to 27,648 tokens), for each model size the paper ran;
//   (b) effective training throughput by eta (the paper's Fig. 5c);
//   (c) interruptible vs waiting generation (Fig. 6b, 4 nodes);
//   (d) scaling from 16 to 512 devices at fixed work per device (Fig. 4);
//   (e) the real controller's capacity, measured in this run, against the
//       rate the 512-device run asks of it;
//   (f) validation on this machine: the real job's bench_async_vs_sync rows
//       (sync, eta = 1, 2, 4, 8 on the demo's workload) measured, and predicted
//       by the simulator with the cost model measured here in the same run;
//   plus the schedule log's repeatability and the sensitivity of (a) to the
//   assumed decode step overhead.
// Every paper number is printed beside ours. Where they differ, the lines say
// which assumption drives it (the cost model prints every parameter's source).
// Usage: bench_simulate [--quick] [--validation-only] [--json FILE] [--log FILE]
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "areal/kernels/allocator.hpp"
#include "areal/runtime/blas_core.hpp"
#include "areal/runtime/cpus.hpp"
#include "areal/sim/simulate_command.hpp"
#include "areal/sim/simulation.hpp"
#include "sim_validation.hpp"

using namespace areal::sim;

namespace {

struct options {
  bool quick = false;
  bool validation_only = false;  // (f) only
  std::string json_path, log_path;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      o.quick = true;
    else if (a == "--json" && i + 1 < argc)
      o.json_path = argv[++i];
    else if (a == "--log" && i + 1 < argc)
      o.log_path = argv[++i];
    else if (a == "--validation-only")
      o.validation_only = true;
    else {
      std::cerr << "usage: bench_simulate [--quick] [--validation-only] [--json FILE] [--log FILE]\n";
      std::exit(2);
    }
  }
  return o;
}

// The paper's setup (ARCHITECTURE.md section 7) for one model on H800s.
sim_setup paper_setup(const std::string& model, int64_t devices, int64_t eta, int64_t steps, double overhead = -1) {
  auto device = gpu_device("h800");
  if (overhead >= 0)
    device.step_overhead.value = overhead;
  sim_setup s;
  s.costs = std::make_shared<roofline_costs>(qwen2_shape(model), device);
  s.devices = devices;
  s.generation_share = 0.75;
  s.eta = eta;
  s.batch_prompts = 512;
  s.group_size = 16;
  s.steps = steps;
  s.keep_log = false;
  s.work.max_new_tokens = 27648;
  s.work.prompt_tokens = 256;
  s.work.length_median = 7000;
  s.work.length_sigma = 0.8;
  s.work.reward_workers = 64 * (devices / 8);
  return s;
}

sim_setup colocated(sim_setup s) {
  s.colocated = true;
  s.eta = 0;
  return s;
}

sim_result run(const sim_setup& s) {
  auto r = simulate(s);
  if (r.exit_code != 0 || r.steps != s.steps)
    throw std::runtime_error("a simulated run ended early: " + r.end_reason);
  return r;
}

std::string eta_name(int64_t eta) {
  return eta < 0 ? std::string{"inf"} : std::to_string(eta);
}

}  // namespace

int main(int argc, char** argv) {
  areal::fit_blas_core(argc, argv);  // (f) runs the real engine and trainer
  areal::kernels::tune_allocator();
  auto opts = parse(argc, argv);
  spdlog::set_level(spdlog::level::warn);  // the controller's lines of every simulated run
  auto started = std::chrono::steady_clock::now();
  nlohmann::json report = {{"bench", "bench_simulate"}, {"quick", opts.quick}, {"threads", areal::cpus().usable()}};
  std::cout << "bench_simulate: virtual-time runs of the real controller with simulated H800 members ("
            << areal::cpus().describe() << "; the simulation runs on one)" << (opts.quick ? "; --quick" : "") << "\n\n";
  // (f) Validation on this machine.
  auto validate = [&] {
    auto threads = areal::cpus().usable();
    std::cout << fmt::format("\n(f) validation on this machine ({} compute threads): the real job's rows of "
                             "bench_async_vs_sync (demo workload) against the simulator with the cost model measured "
                             "here now\n",
                             threads);
    report["validation"] = areal::bench::validate_on_this_machine(opts.quick, threads, std::cout);
  };
  auto finish = [&] {
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::cout << fmt::format("bench_simulate took {:.0f} s\n", wall);
    report["wall_s"] = wall;
    if (!opts.json_path.empty())
      std::ofstream(opts.json_path) << report.dump(2) << "\n";
  };
  if (opts.validation_only) {
    validate();
    finish();
    return 0;
  }
  {
    roofline_costs costs{qwen2_shape("qwen2-1.5b"), gpu_device("h800")};
    auto s = paper_setup("qwen2-1.5b", 128, 8, 1);
    std::cout << "cost model (every parameter with its source):\n" << costs.describe();
    std::cout << fmt::format(
        "workload: prompts of {} tokens (assumption); answers log-normal, median {:.0f}, sigma {:.1f}, capped at {} "
        "(assumption: R1-distilled models answer ~10k tokens on average with a tail to the cap; mean here {:.0f}); "
        "{} answers per step; an engine holds {} sequences (its KV cache at the mean length)\n\n",
        s.work.prompt_tokens, s.work.length_median, s.work.length_sigma, s.work.max_new_tokens,
        s.work.mean_response_tokens(), s.batch_prompts * s.group_size, s.slots_per_engine());
    report["cost_model"] = costs.describe();
  }
  const int64_t steps = opts.quick ? 10 : 30;

  // (a) Table 1: hours sync / AReaL from the paper.
  struct table1_row {
    const char* model;
    int64_t nodes, eta;
    double paper_sync_h, paper_async_h;
  };
  std::vector<table1_row> table1 = {{"qwen2-1.5b", 16, 8, 41.0, 14.8}, {"qwen2-7b", 24, 8, 57.7, 25.4},
                                    {"qwen2-14b", 32, 4, 48.8, 21.9}, {"qwen2-32b", 48, 4, 51.1, 31.1}};
  if (opts.quick)
    table1.resize(1);
  std::cout << fmt::format("(a) async vs sync, the paper's Table 1 setup ({} steps each; sync = every device "
                           "generates then trains, eta 0; async = 3/4 generate, 1/4 train)\n",
                           steps);
  std::cout << fmt::format("  {:<11} {:>7} {:>4} {:>14} {:>14} {:>14} {:>9} {:>9} {:>9}\n", "model", "devices", "eta",
                           "sync tok/s", "async tok/s", "split-sync", "speedup", "paper", "diff");
  for (auto& row : table1) {
    auto devices = row.nodes * 8;
    auto async = run(paper_setup(row.model, devices, row.eta, steps));
    auto sync = run(colocated(paper_setup(row.model, devices, 0, steps)));
    auto split = run(paper_setup(row.model, devices, 0, steps));
    double speedup = async.steady_tokens_per_second() / sync.steady_tokens_per_second();
    double paper = row.paper_sync_h / row.paper_async_h;
    std::cout << fmt::format("  {:<11} {:>7} {:>4} {:>14.0f} {:>14.0f} {:>14.0f} {:>8.2f}x {:>8.2f}x {:>+8.0f}%\n",
                             row.model, devices, row.eta, sync.steady_tokens_per_second(),
                             async.steady_tokens_per_second(), split.steady_tokens_per_second(), speedup, paper,
                             100 * (speedup / paper - 1));
    std::cout << fmt::format("    engines busy: sync {:.0f}%, async {:.0f}% (re-prefill {:.1f}%); trainer busy: sync "
                             "{:.0f}%, async {:.0f}%; async staleness <= {}\n",
                             100 * sync.engine_busy_share, 100 * async.engine_busy_share,
                             100 * async.reprefill_share, 100 * sync.trainer_busy_share,
                             100 * async.trainer_busy_share, async.max_staleness);
    report["table1"].push_back({{"model", row.model}, {"devices", devices}, {"eta", row.eta},
                                {"speedup", speedup}, {"paper_speedup", paper}, {"sync", result_json(sync)},
                                {"async", result_json(async)}, {"split_sync", result_json(split)}});
  }
  std::cout << "  (the paper's speedup is in hours to the same accuracy; ours is trained tokens per second, equal "
               "samples per step)\n\n";

  // Sensitivity of (a) to the one decode-step parameter no measurement gives.
  std::cout << "  sensitivity of the 1.5B speedup to the assumed decode step overhead:";
  for (double overhead : {0.0, 0.002, 0.005}) {
    auto a = run(paper_setup("qwen2-1.5b", 128, 8, steps, overhead));
    auto s = run(colocated(paper_setup("qwen2-1.5b", 128, 0, steps, overhead)));
    double x = a.steady_tokens_per_second() / s.steady_tokens_per_second();
    std::cout << fmt::format(" {:.0f} ms: {:.2f}x;", overhead * 1e3, x);
    report["overhead_sensitivity"].push_back({{"overhead_s", overhead}, {"speedup", x}});
  }
  std::cout << "\n\n";

  // (b) Fig. 5c: effective throughput by eta.
  std::vector<std::pair<int64_t, double>> fig5c = {{0, 128.7}, {1, 269.3}, {2, 356.6}, {4, 356.6},
                                                   {8, 371.7}, {16, 382.4}, {-1, 396.8}};
  std::cout << fmt::format("(b) effective training throughput by eta (1.5B, 128 H800, {} steps each)\n", steps);
  std::cout << fmt::format("  {:>4} {:>14} {:>10} {:>16} {:>10} {:>10}\n", "eta", "k tokens/s", "vs eta 0",
                           "paper k tok/s", "paper vs 0", "staleness");
  double base = 0;
  for (auto [eta, paper] : fig5c) {
    auto r = run(paper_setup("qwen2-1.5b", 128, eta, steps));
    if (eta == 0)
      base = r.steady_tokens_per_second();
    std::cout << fmt::format("  {:>4} {:>14.1f} {:>9.2f}x {:>16.1f} {:>9.2f}x {:>10}\n", eta_name(eta),
                             r.steady_tokens_per_second() / 1e3, r.steady_tokens_per_second() / base, paper,
                             paper / 128.7, r.max_staleness);
    report["eta"].push_back({{"eta", eta_name(eta)}, {"paper_k_tokens_per_s", paper}, {"run", result_json(r)}});
  }
  std::cout << "\n";

  // (c) Fig. 6b: interruptible vs waiting generation on 4 nodes.
  std::cout << fmt::format("(c) interruptible vs waiting generation (4 nodes, 32 H800, eta 8, {} steps)\n", steps);
  std::vector<std::pair<const char*, double>> fig6b = {{"qwen2-1.5b", 12}, {"qwen2-7b", 17}};
  if (opts.quick)
    fig6b.resize(1);
  for (auto [model, paper] : fig6b) {
    auto s = paper_setup(model, 32, 8, steps);
    s.batch_prompts = 128;  // a quarter of the devices, a quarter of the work
    auto interrupting = run(s);
    s.on_weights = interruption::wait;
    auto waiting = run(s);
    double gain = interrupting.steady_tokens_per_second() / waiting.steady_tokens_per_second() - 1;
    std::cout << fmt::format("  {:<11} interruptible {:.0f} tok/s, waiting {:.0f} tok/s: {:+.0f}% (paper {:+.0f}%); "
                             "re-prefill took {:.1f}% of engine time\n",
                             model, interrupting.steady_tokens_per_second(), waiting.steady_tokens_per_second(),
                             100 * gain, paper, 100 * interrupting.reprefill_share);
    report["interruption"].push_back({{"model", model}, {"gain", gain}, {"paper_gain", paper / 100},
                                      {"interruptible", result_json(interrupting)}, {"waiting", result_json(waiting)}});
  }
  std::cout << "\n";

  // (d) Fig. 4: scaling at fixed work per device (32 prompts x 16 answers per 8 devices per step).
  std::cout << fmt::format("(d) scaling at fixed work per device (1.5B, eta 8, 4 prompts x 16 answers per device per "
                           "step, {} steps)\n",
                           steps);
  std::vector<int64_t> sizes = {16, 32, 64, 128, 256, 512};
  double per_device_16 = 0;
  sim_result biggest;
  for (auto devices : sizes) {
    auto s = paper_setup("qwen2-1.5b", devices, 8, steps);
    s.batch_prompts = 4 * devices;
    auto r = run(s);
    double per_device = r.steady_tokens_per_second() / double(devices);
    if (devices == 16)
      per_device_16 = per_device;
    double efficiency = per_device / per_device_16;
    std::cout << fmt::format("  {:>4} devices: {:>10.0f} tok/s, {:.0f} per device, efficiency {:.1f}% of linear "
                             "from 16; simulated in {:.1f} s ({} events)\n",
                             devices, r.steady_tokens_per_second(), per_device, 100 * efficiency, r.wall_seconds,
                             r.events);
    report["scaling"].push_back({{"devices", devices}, {"efficiency", efficiency}, {"run", result_json(r)}});
    if (devices == 512)
      biggest = r;
  }
  std::cout << "  (paper: near-linear to 512 GPUs)\n";
  if (!opts.quick) {
    // The size of run the simulator is meant for: 512 devices, 100 steps.
    auto s = paper_setup("qwen2-1.5b", 512, 8, 100);
    s.batch_prompts = 4 * 512;
    auto r = run(s);
    std::cout << fmt::format("  512 devices, 100 steps: simulated in {:.0f} s ({} messages; target: under 600 s); "
                             "{:.0f} tok/s once full\n",
                             r.wall_seconds, r.events, r.steady_tokens_per_second());
    report["run_512_100"] = result_json(r);
  }
  std::cout << "\n";

  // (e) The controller's capacity: how fast the real controller (with the
  // simulated members, which only add work) moves samples, against the rate the
  // 512-device run demands of it.
  // The controller's share: the run's wall time less the simulated members' handlers
  // (what is left also holds the scheduler's message passing: a lower bound on its capacity).
  double controller_s = biggest.wall_seconds - biggest.member_wall_seconds;
  double capacity = double(biggest.trained_samples) / controller_s;
  double messages = double(biggest.events) / biggest.wall_seconds;
  double demand = biggest.samples_per_second();
  double demand_messages = double(biggest.events) / biggest.virtual_seconds;
  std::cout << fmt::format(
      "(e) controller capacity, measured in the 512-device run: {:.0f} trained samples/s through one thread "
      "(all messages of the simulation: {:.0f}/s; {:.1f} of the run's {:.1f} s were spent outside the simulated "
      "members: the controller, its link actors and the message passing); the 512-device run demands {:.0f} "
      "samples/s and {:.0f} messages/s: {:.0f}x headroom\n\n",
      capacity, messages, controller_s, biggest.wall_seconds, demand, demand_messages, capacity / demand);
  report["controller"] = {{"samples_per_s", capacity},
                          {"messages_per_s", messages},
                          {"controller_wall_s", controller_s},
                          {"demand_samples_per_s", demand},
                          {"demand_messages_per_s", demand_messages}};

  // Replay: the same setup and seed give the same schedule, byte for byte.
  {
    auto s = paper_setup("qwen2-1.5b", 16, 8, opts.quick ? 2 : 4);
    s.batch_prompts = 64;
    s.keep_log = true;
    auto a = run(s), b = run(s);
    bool same = a.schedule_log == b.schedule_log;
    std::cout << fmt::format("replay: two runs of one setup and seed wrote {} byte schedule logs, {} (hash {:016x})\n",
                             a.schedule_log.size(), same ? "identical" : "DIFFERENT", a.schedule_hash);
    report["replay"] = {{"identical", same}, {"bytes", a.schedule_log.size()}};
    if (!opts.log_path.empty())
      std::ofstream(opts.log_path) << a.schedule_log;
  }
  validate();
  finish();
}
