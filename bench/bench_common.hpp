// What every benchmark shares: its command line (--quick, --json FILE,
// --threads N), its stopwatch and the GEMM ceiling at a model's shape.
#pragma once

#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <random>

#include "areal/kernels/blas_probe.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/engine.hpp"
#include "areal/kernels/model_config.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/blas_core.hpp"
#include "areal/runtime/cpus.hpp"

namespace areal::bench {

/// Seconds since `start` on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The means of `measure()` over `rounds` runs with the CPU loops balanced over the threads and as many
/// with them split evenly (kernels::set_balanced_loops), alternating; balanced again afterwards.
struct balanced_and_even {
  double balanced = 0, even = 0;
};
inline balanced_and_even measure_balanced_and_even(int rounds, const std::function<double()>& measure) {
  balanced_and_even m;
  for (int r = 0; r < rounds; ++r)
    for (bool on : {true, false}) {
      kernels::set_balanced_loops(on);
      (on ? m.balanced : m.even) += measure() / rounds;
    }
  kernels::set_balanced_loops(true);
  return m;
}

struct options {
  bool quick = false;
  std::string json_path;
  int threads = areal::cpus().usable();  // the CPUs this process may use (affinity, cgroup quota)
};

/// Fits OpenBLAS's kernels to the CPU (it may execute the benchmark again),
/// then parses the common flags; prints usage and exits with code 2 on anything else.
inline options parse_options(int argc, char** argv, const char* name) {
  fit_blas_core(argc, argv);
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--json" && i + 1 < argc) {
      o.json_path = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      std::string n = argv[++i];
      o.threads = n.find_first_not_of("0123456789") == std::string::npos && n.size() <= 4 ? std::atoi(n.c_str()) : 0;
      if (o.threads < 1 || o.threads > 1024) {
        std::string program = name;
        std::cerr << program.substr(0, program.find(' ')) << ": --threads " << n
                  << ": give a count of threads from 1 to 1024 (default: the " << areal::cpus().usable()
                  << " CPUs this process may use)\n";
        std::exit(2);
      }
    } else {
      std::cerr << "usage: " << name << " [--quick] [--json FILE] [--threads N]\n";
      std::exit(2);
    }
  }
  return o;
}

/// Takes a benchmark's own `flag VALUE` out of the arguments (the rest go to
/// parse_options); returns VALUE, or `fallback` when the flag is not given.
inline std::string take_flag(int& argc, char** argv, const std::string& flag, std::string fallback) {
  int kept = 0;
  for (int i = 0; i < argc; ++i) {
    if (flag == argv[i] && i + 1 < argc)
      fallback = argv[++i];
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  return fallback;
}

/// A generated answer as a sample the trainer trains on, with an advantage of
/// +1 or -1 at random (the cost of a PPO step does not depend on its values).
inline kernels::rl_sample training_sample(const kernels::generation_output& out, std::mt19937& rng) {
  kernels::rl_sample s;
  s.prompt = out.prompt;
  s.response = out.tokens;
  s.behaviour_logprobs = out.logprobs;
  s.advantage = (rng() % 2) ? 1.0 : -1.0;
  return s;
}

/// The fp32 rate of the model's largest product shape (512 rows x hidden x intermediate).
inline double gemm_ceiling_gflops(const kernels::model_config& c) {
  return kernels::measure_gemm_gflops(512, c.hidden_size, c.intermediate_size, 10);
}

/// The same shape's rate when `threads` threads each run it with one intra-op
/// thread at once (the trainer's data-parallel replicas): the sum of their rates.
double concurrent_gemm_ceiling_gflops(const kernels::model_config& c, int threads);

/// Model FLOPs of one forward pass over sequences of these lengths, of which
/// `scored` tokens go through the LM head (the trainer scores response tokens
/// only), counted as: 2 * (matrix parameters of the layers) per token, plus
/// 2 * hidden * vocab per scored token, plus causal attention 2 * 2 * (heads *
/// head_dim) * L(L+1)/2 per sequence and layer (QK^T and AV over the pairs a
/// token may attend to). Embedding lookups, norms and element-wise work: none.
/// Backward is counted as twice the forward.
double forward_flops(const kernels::model_config& c, const std::vector<int64_t>& lengths, int64_t scored);

/// Model FLOPs of one decode step of `batch` sequences whose new token sits at
/// position `context` (it attends to context + 1 positions): per token 2 *
/// (matrix parameters of the layers) + 2 * hidden * vocab (the LM head) +
/// 2 * 2 * (heads * head_dim) * (context + 1) per layer (QK^T and AV).
double decode_flops(const kernels::model_config& c, int64_t batch, int64_t context);

}  // namespace areal::bench
