// The real RL job as the benchmarks run it (see bench_jobs.hpp).
#include "bench_jobs.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "areal/runtime/files.hpp"

namespace areal::bench {

namespace {

// The workload's sections; the topology (`nodes`: [cluster] and [[nodes]]) follows them.
std::string config_text(const workload& w, const std::string& nodes) {
  std::ostringstream os;
  os << "[run]\nname = \"bench\"\nseed = 5\n\n[model]\npreset = \"" << w.preset << "\"\n\n"
     << "[task]\nmax_value = " << w.max_value << "\nmedian_terms = " << w.median_terms
     << "\nmax_terms = " << w.max_terms << "\ntruncated_fraction = " << w.truncated_fraction << "\n\n"
     << "[sft]\nsteps = " << w.sft_steps << "\n\n"
     << "[rl]\nsteps = " << w.rl_steps << "\nbatch_size = " << w.batch_size << "\ngroup_size = " << w.group_size
     << "\nmax_new_tokens = " << w.max_new_tokens << "\ncheckpoint_every = 0\n\n"
     << "[eval]\nprompts = " << w.eval_prompts << "\nevery = 0\n\n"
     << nodes;
  return os.str();
}

std::string one_node(int threads) {
  return "[[nodes]]\nname = \"local\"\nroles = [\"controller\", \"trainer\", \"rollout\", \"reward\"]\n"
         "compute_threads = " +
         std::to_string(threads) + "\n";
}

}  // namespace

workload demo_workload(int64_t sft_steps, int64_t rl_steps, int64_t eval_prompts, std::vector<std::string> extra) {
  return {"demo (tiny preset, running sums, median 3 terms)",
          "tiny",
          9,
          8,
          3.0,
          0.6,
          32,
          sft_steps,
          rl_steps,
          64,
          8,
          eval_prompts,
          std::move(extra)};
}

run_config make_config(const workload& w, int threads, std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), w.extra.begin(), w.extra.end());
  auto r = parse_config(config_text(w, one_node(threads)), "bench.toml", overrides);
  if (!r.config) {
    std::cerr << "bench configuration: " << r.errors.front() << "\n";
    std::exit(1);
  }
  return *r.config;
}

std::string four_process_config(const workload& w, const std::vector<uint16_t>& ports) {
  if (ports.size() != 4)
    throw std::invalid_argument("four_process_config: four ports");
  std::ostringstream nodes;
  nodes << "[cluster]\napp_id = \"areal-bench-four\"\nsecurity = \"plain\"\nweight_transport = \"gloo\"\n"
        << "connect_timeout_s = 120.0\n\n";
  const char* names[] = {"head", "scorer", "gen-a", "gen-b"};
  const char* roles[] = {"\"controller\", \"trainer\"", "\"reward\"", "\"rollout\"", "\"rollout\""};
  for (size_t i = 0; i < 4; ++i)
    nodes << "[[nodes]]\nname = \"" << names[i] << "\"\nhost = \"127.0.0.1\"\nport = " << ports[i] << "\nroles = ["
          << roles[i] << "]\ncompute_threads = 1\n\n";
  return config_text(w, nodes.str());
}

rl_job_result run_job(const run_config& config, const std::filesystem::path& dir, int threads, bool share) {
  rl_job_options o;
  o.config = config;
  o.run_dir = dir;
  o.compute_threads = threads;
  o.share_cores = share;
  o.progress = false;
  // The resolved configuration beside the outputs, as the areal binary writes it (a replay reads it).
  std::filesystem::create_directories(dir);
  write_file_atomically(dir / "config.toml", config.resolved_toml);
  std::atomic<bool> stop{false};
  return run_rl_job(o, stop);
}

time_use read_time_use(const std::filesystem::path& trace_file) {
  std::ifstream in(trace_file);
  auto trace = nlohmann::json::parse(in, nullptr, false);
  if (!in || trace.is_discarded() || !trace.contains("traceEvents"))
    throw std::runtime_error(trace_file.string() + ": not a trace the job wrote");
  // Spans in microseconds: [start, end).
  std::vector<std::pair<double, double>> training, generating;
  time_use use;
  for (auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X")
      continue;
    auto name = e.value("name", "");
    double start = e.value("ts", 0.0), end = start + e.value("dur", 0.0);
    auto args = e.value("args", nlohmann::json::object());
    double cpu_s = static_cast<double>(args.value("cpu_us", int64_t{0})) / 1e6;
    if (name == "train") {
      training.emplace_back(start, end);
      use.train_s += (end - start) / 1e6;
      use.train_cpu_s += cpu_s;
      use.train_replicas_waited_s += static_cast<double>(args.value("replicas_waited_us", int64_t{0})) / 1e6;
    } else if (name == "generate") {
      generating.emplace_back(start, end);
      use.generate_s += (end - start) / 1e6;
      use.generate_cpu_s += cpu_s;
      use.engine_steps++;
      use.decode_rows += args.value("batch", int64_t{0});
    }
  }
  if (training.empty())
    throw std::runtime_error(trace_file.string() + ": no step of the trainer in it");
  // The trainer's steps do not overlap one another: each engine step's overlap
  // with them, walking both in time order.
  std::sort(training.begin(), training.end());
  std::sort(generating.begin(), generating.end());
  size_t t = 0;
  for (auto& [start, end] : generating) {
    while (t < training.size() && training[t].second <= start)
      ++t;
    for (size_t k = t; k < training.size() && training[k].first < end; ++k)
      use.generate_beside_train_s += (std::min(end, training[k].second) - std::max(start, training[k].first)) / 1e6;
  }
  return use;
}

}  // namespace areal::bench
