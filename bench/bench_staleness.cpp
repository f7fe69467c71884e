// bench_staleness: the staleness ablation with real training, in the shape of
// the paper's Table 2. Held-out greedy accuracy of decoupled PPO (behaviour,
// proximal and current policy) against plain PPO (anchored at the behaviour
// policy) at eta = 0 (synchronous), 2, 4, 8, 16 and unbounded, over several
// seeds, every run training the same number of samples from the same
// warm-started model. The workload is made for staleness to bite: the demo's
// task with a learning rate four times the demo's and up to four batches of
// requests in flight, so that an unbounded run's samples fall many versions behind.
// Each row prints the mean and spread of the accuracy and the staleness the
// runs really had (per token, from their metrics); nothing here is timed.
// Usage: bench_staleness [--quick] [--json FILE] [--threads N] [--lr X]
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "bench_jobs.hpp"

#include "areal/kernels/allocator.hpp"
#include "areal/runtime/log.hpp"

namespace fs = std::filesystem;
using namespace areal;

namespace {

constexpr int64_t unbounded = 1000;  // rl.eta's largest value: beyond any run's steps here

// Token-weighted staleness of the trained batches and the w-cap's masked share, from a run's metrics.
struct staleness_seen {
  double token_mean = 0, masked = 0;
};
staleness_seen read_staleness(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::string line;
  double tokens = 0, behind = 0, masked = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || j.value("event", "") != "step")
      continue;
    double t = j.value("trained_tokens", 0.0);
    tokens += t;
    behind += t * j.value("staleness_token_mean", 0.0);
    masked += t * j.value("masked_fraction", 0.0);
  }
  return tokens > 0 ? staleness_seen{behind / tokens, masked / tokens} : staleness_seen{};
}

struct spread {
  double mean = 0, sd = 0, min = 0, max = 0;
};
spread describe(const std::vector<double>& x) {
  spread s;
  if (x.empty())
    return s;
  s.min = s.max = x[0];
  for (double v : x) {
    s.mean += v / static_cast<double>(x.size());
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
  }
  for (double v : x)
    s.sd += (v - s.mean) * (v - s.mean);
  s.sd = x.size() > 1 ? std::sqrt(s.sd / static_cast<double>(x.size() - 1)) : 0.0;
  return s;
}

std::string eta_name(int64_t eta) {
  return eta == unbounded ? "inf" : std::to_string(eta);
}

}  // namespace

int main(int argc, char** argv) {
  fit_blas_core(argc, argv);  // with every argument: it may execute the benchmark again
  kernels::tune_allocator();
  // --lr X (default 4e-4, four times the demo's); the other flags are every benchmark's.
  auto lr = bench::take_flag(argc, argv, "--lr", "4e-4");
  auto opts = bench::parse_options(argc, argv, "bench_staleness [--lr X]");
  int threads = std::max(1, opts.threads);
  auto facts = kernels::probe_blas();
  std::cout << "bench_staleness: " << threads << " compute threads; " << kernels::describe(facts)
            << (opts.quick ? "; --quick" : "") << "\n";
  spdlog::set_level(spdlog::level::warn);

  auto w = bench::demo_workload(opts.quick ? 200 : 600, opts.quick ? 30 : 150, opts.quick ? 128 : 256,
                                {"rl.lr=" + lr, "rl.max_concurrent=256"});
  w.name = "the demo's, with lr " + lr + " and up to four batches in flight";
  std::vector<int64_t> etas = opts.quick ? std::vector<int64_t>{0, 4, unbounded}
                                         : std::vector<int64_t>{0, 2, 4, 8, 16, unbounded};
  std::vector<uint64_t> seeds = opts.quick ? std::vector<uint64_t>{1} : std::vector<uint64_t>{1, 2, 3};
  std::cout << "workload: " << w.name << "; " << w.rl_steps << " RL steps of " << w.batch_size << " samples ("
            << w.rl_steps * w.batch_size << " trained samples per run), " << seeds.size() << " seed(s), held-out "
            << w.eval_prompts << " prompts\n";

  auto scratch = fs::temp_directory_path() / ("areal-bench-staleness-" + std::to_string(getpid()));
  auto warm_dir = scratch / "warm";
  auto warm = bench::run_job(bench::make_config(w, threads, {"rl.steps=0", "eval.prompts=0"}), warm_dir, threads, true);
  auto model_dir = warm_dir / "sft_model";
  if (warm.exit_code != 0 || !fs::exists(model_dir)) {
    std::cerr << "the warm start failed: " << warm.why << "\n";
    return 1;
  }

  nlohmann::json report = {{"bench", "bench_staleness"},
                           {"threads", threads},
                           {"blas", kernels::describe(facts)},
                           {"quick", opts.quick},
                           {"workload", w.name},
                           {"lr", lr},
                           {"trained_samples", w.rl_steps * w.batch_size},
                           {"rows", nlohmann::json::array()}};
  std::cout << std::fixed << std::setprecision(1) << "\n"
            << std::setw(10) << "objective" << std::setw(6) << "eta" << std::setw(20) << "accuracy % (sd)"
            << std::setw(16) << "min..max" << std::setw(18) << "token staleness" << std::setw(8) << "max"
            << std::setw(10) << "masked %" << "\n";
  double before = -1;
  for (bool decoupled : {true, false})
    for (auto eta : etas) {
      std::vector<double> accuracy, token_staleness, masked;
      int64_t max_staleness = 0;
      for (auto seed : seeds) {
        std::vector<std::string> overrides = {"model.path=\"" + model_dir.string() + "\"", "sft.steps=0",
                                              "run.seed=" + std::to_string(seed),
                                              std::string{"rl.decoupled="} + (decoupled ? "true" : "false")};
        overrides.push_back(eta == 0 ? "rl.mode=\"sync\"" : "rl.eta=" + std::to_string(eta));
        auto dir = scratch / "run";
        fs::remove_all(dir);
        auto r = bench::run_job(bench::make_config(w, threads, overrides), dir, threads, true);
        if (r.exit_code != 0 || r.accuracy_after < 0) {
          std::cerr << "a run failed (" << (decoupled ? "decoupled" : "plain") << ", eta " << eta_name(eta)
                    << ", seed " << seed << "): " << r.why << "\n";
          return 1;
        }
        before = r.accuracy_before;
        accuracy.push_back(100 * r.accuracy_after);
        auto seen = read_staleness(dir / "metrics.jsonl");
        token_staleness.push_back(seen.token_mean);
        masked.push_back(100 * seen.masked);
        max_staleness = std::max(max_staleness, r.stats.max_staleness);
      }
      auto a = describe(accuracy);
      auto s = describe(token_staleness);
      auto m = describe(masked);
      std::ostringstream acc, range;
      acc << std::fixed << std::setprecision(1) << a.mean << " (" << a.sd << ")";
      range << std::fixed << std::setprecision(1) << a.min << ".." << a.max;
      std::cout << std::setw(10) << (decoupled ? "decoupled" : "plain") << std::setw(6) << eta_name(eta)
                << std::setw(20) << acc.str() << std::setw(16) << range.str() << std::setw(18) << std::setprecision(2)
                << s.mean << std::setw(8) << max_staleness << std::setw(10) << std::setprecision(1) << m.mean
                << std::endl;
      report["rows"].push_back({{"objective", decoupled ? "decoupled" : "plain"},
                                {"eta", eta_name(eta)},
                                {"accuracy", accuracy},
                                {"accuracy_mean", a.mean},
                                {"accuracy_sd", a.sd},
                                {"token_staleness_mean", s.mean},
                                {"max_staleness", max_staleness},
                                {"masked_percent", m.mean}});
    }
  std::cout << "held-out accuracy before RL (the warm start): " << 100 * before << "%\n";
  report["accuracy_before"] = 100 * before;
  fs::remove_all(scratch);
  if (!opts.json_path.empty())
    std::ofstream(opts.json_path) << report.dump(2) << "\n";
  return 0;
}
