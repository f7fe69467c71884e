// bench_generation: the rollout engine on this machine, measured side by side.
//   - the GEMM ceiling: fp32 product of the model's MLP shape, same threads, the
//     faster of OpenBLAS (at::mm) and the decode step's own product over packed
//     weights (cpu_packed_gemm.hpp), both printed;
//   - decode tokens/s at batch 1..128 for both presets, and efficiency =
//     model FLOPs (decode_flops in bench_common.hpp: layers, LM head,
//     attention over the context) / time / that ceiling at the same M (batch
//     rows x hidden x intermediate), measured in the same run; `small` also at
//     Qwen2's vocabulary of 151,936, where the LM head is the largest product;
//   - the decode step's loops balanced over the threads vs split evenly (small, batch 64), quiet and
//     beside a thread that computes without pause on one CPU;
//   - continuous vs static batching on a long-tailed output-length workload
//     (static: a batch runs until its longest member ends; only useful tokens count);
//   - the cost of an interruption (re-prefill) per 1k tokens in flight, and the
//     three interruption modes (reprefill, keep_cache, wait) on the same workload;
//   - shared group prompts: n samples of each prompt (512 and 2,048 tokens, n = 8
//     and 16) with the prompt pool on and off: prompt tokens computed and
//     tokens/s end to end (prefill included);
//   - resident memory before and after many decode steps.
// Usage: bench_generation [--quick] [--json FILE] [--threads N]
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)
#include <nlohmann/json.hpp>

#include "bench_common.hpp"

#include "areal/kernels/allocator.hpp"
#include "areal/kernels/blas_probe.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/engine.hpp"
#include "areal/runtime/cpus.hpp"

using namespace areal;
using namespace areal::kernels;
using areal::bench::seconds_since;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int64_t vocab = 64;

double resident_mb() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1e6;
}

generation_job make_job(uint64_t id, int64_t prompt_len, uint32_t max_new) {
  generation_job j;
  j.id = id;
  for (int64_t i = 0; i < prompt_len; ++i)
    j.prompt.push_back(static_cast<int32_t>((id * 7 + static_cast<uint64_t>(i) * 3) % vocab));
  j.sampling.max_new_tokens = max_new;
  j.seed = id + 1;
  return j;
}

constexpr int64_t decode_prompt = 16;

// Decode tokens/s with `batch` sequences decoding together (prefill excluded);
// `flops` gets the model FLOPs of the timed steps.
double decode_rate(policy_model& model, int64_t batch, int steps, double* flops = nullptr) {
  generation_engine engine(model, {batch, 64 + steps + 8, 4096});
  for (int64_t i = 0; i < batch; ++i)
    engine.submit(make_job(static_cast<uint64_t>(i), decode_prompt, static_cast<uint32_t>(steps + 1)));
  engine.step();  // prefill of every prompt, first token
  auto start = clock_type::now();
  for (int s = 0; s < steps; ++s)
    engine.step();
  auto seconds = seconds_since(start);
  if (flops) {
    *flops = 0;
    for (int s = 0; s < steps; ++s)  // step s decodes the token at position prompt + 1 + s
      *flops += bench::decode_flops(model.config(), batch, decode_prompt + 1 + s);
  }
  return static_cast<double>(batch * steps) / seconds;
}

std::vector<uint32_t> long_tail_lengths(int count, uint32_t median, uint32_t cap, uint32_t seed) {
  std::mt19937 rng{seed};
  std::lognormal_distribution<double> dist(std::log(static_cast<double>(median)), 0.9);
  std::vector<uint32_t> out;
  for (int i = 0; i < count; ++i)
    out.push_back(std::clamp<uint32_t>(static_cast<uint32_t>(dist(rng)), 2, cap));
  return out;
}

struct workload_result {
  double useful_tokens_per_s;
  double seconds;
};

workload_result run_continuous(policy_model& model, const std::vector<uint32_t>& lengths, int64_t slots,
                               interruption_mode interruption, int update_every) {
  generation_engine engine(model, {slots, 16 + 512, 256, interruption});
  for (size_t i = 0; i < lengths.size(); ++i)
    engine.submit(make_job(i, 16, lengths[i]));
  auto same_weights = model.flat().clone();
  auto start = clock_type::now();
  uint64_t useful = 0;
  for (int step = 1; !engine.idle(); ++step) {
    if (update_every > 0 && step % update_every == 0)
      engine.update_weights(step, same_weights);
    for (auto& out : engine.step())
      useful += out.tokens.size();
  }
  auto s = seconds_since(start);
  return {static_cast<double>(useful) / s, s};
}

struct group_result {
  uint64_t prefill_tokens;  // prompt tokens computed (pool fills included)
  double tokens_per_s;      // generated tokens over the whole run, prefill included
};

// `groups` prompts of `prompt_len` tokens, `n` samples each, all in flight at once.
group_result run_groups(policy_model& model, int64_t prompt_len, int64_t n, int groups, uint32_t new_tokens,
                        bool share) {
  engine_config config{n * groups, prompt_len + new_tokens + 1, 512};
  config.prompt_pool_tokens = share ? groups * prompt_len : 0;
  generation_engine engine(model, config);
  for (int g = 0; g < groups; ++g)
    for (int64_t i = 0; i < n; ++i) {
      auto job = make_job(static_cast<uint64_t>(g) * 1000 + static_cast<uint64_t>(i), prompt_len, new_tokens);
      for (int64_t t = 0; t < prompt_len; ++t)  // the group's own prompt, the same for its n samples
        job.prompt[static_cast<size_t>(t)] = static_cast<int32_t>((g * 31 + t * 7 + t * t) % vocab);
      engine.submit(job);
    }
  auto start = clock_type::now();
  uint64_t generated = 0;
  while (!engine.idle())
    for (auto& out : engine.step())
      generated += out.tokens.size();
  return {engine.counters().prefill_tokens, static_cast<double>(generated) / seconds_since(start)};
}

workload_result run_static(policy_model& model, const std::vector<uint32_t>& lengths, int64_t slots) {
  auto start = clock_type::now();
  uint64_t useful = 0;
  for (size_t begin = 0; begin < lengths.size(); begin += static_cast<size_t>(slots)) {
    auto end = std::min(lengths.size(), begin + static_cast<size_t>(slots));
    auto longest =
        *std::max_element(lengths.begin() + static_cast<long>(begin), lengths.begin() + static_cast<long>(end));
    generation_engine engine(model, {slots, 16 + 512, 4096});
    for (size_t i = begin; i < end; ++i) {
      engine.submit(make_job(i, 16, longest));  // everyone runs as long as the longest
      useful += lengths[i];
    }
    engine.run_to_completion();
  }
  auto s = seconds_since(start);
  return {static_cast<double>(useful) / s, s};
}

}  // namespace

int main(int argc, char** argv) {
  auto cli = bench::parse_options(argc, argv, "bench_generation");
  bool quick = cli.quick;
  std::string json_path = cli.json_path;
  int threads = cli.threads;
  auto allocator = tune_allocator();
  kernels::set_compute_threads(threads);
  at::NoGradGuard no_grad;
  nlohmann::json out;
  auto facts = probe_blas();
  std::cout << "machine: " << areal::cpus().describe() << "; " << describe(facts) << "; " << allocator << "\n";
  out["bench"] = "bench_generation";
  out["threads"] = facts.intra_op_threads;
  out["blas"] = facts.library;

  struct decode_case {
    std::string name;
    int64_t vocab_size;
    std::vector<int64_t> batches;
  };
  std::vector<decode_case> cases = {
      {"tiny", vocab, {1, 8, 32, 64, 128}}, {"small", vocab, {1, 8, 32, 64, 128}}, {"small", 151936, {1, 64}}};
  for (auto& dc : cases) {
    auto config = preset(dc.name, dc.vocab_size);
    policy_model model(config);
    model.init_random(1);
    auto key = dc.name + (dc.vocab_size == vocab ? "" : "_vocab_" + std::to_string(dc.vocab_size));
    std::cout << dc.name << ", vocabulary " << dc.vocab_size << ": " << config.parameter_count()
              << " parameters; efficiency = model GFLOP/s / the faster GEMM at M = batch (M x " << config.hidden_size
              << " x " << config.intermediate_size << " fp32, same threads)\n";
    out[key]["parameters"] = config.parameter_count();
    for (auto batch : dc.batches) {
      // --quick: 24 steps at the large batches; with 8 (about 0.15 s on `small`) two runs back to
      // back measured 0.63 and 0.42 of the ceiling at batch 64.
      int steps = quick ? (batch >= 64 ? 24 : 16) : 48;
      if (quick && dc.name == "small" && batch == 128)
        steps = 16;
      // Decode and the ceiling alternate, `rounds` times each: this machine's speed drifts by a third
      // within minutes, and a ceiling measured once after the decode could land in another minute.
      int rounds = quick ? 2 : 3;
      double flops = 0, seconds = 0, blas = 0, packed = 0;
      for (int round = 0; round < rounds; ++round) {
        double round_flops = 0;
        seconds += static_cast<double>(batch * steps) / decode_rate(model, batch, steps, &round_flops);
        flops += round_flops;
        // The ceiling: the faster of the two GEMMs at this M, OpenBLAS's and the decode step's own over
        // packed weights (which the step uses on the CPU in float32), each on hot caches.
        blas += kernels::measure_gemm_gflops(batch, config.hidden_size, config.intermediate_size, 10) / rounds;
        packed += kernels::measure_packed_gemm_gflops(batch, config.hidden_size, config.intermediate_size, 10) / rounds;
      }
      double rate = static_cast<double>(batch * steps * rounds) / seconds;
      double ceiling = std::max(blas, packed);
      double gflops = flops / seconds / 1e9;
      std::cout << "  decode batch " << batch << ": " << rate << " tokens/s, " << gflops << " model GFLOP/s; ceiling "
                << ceiling << " GFLOP/s (OpenBLAS " << blas << ", packed " << packed << "); efficiency "
                << gflops / ceiling << " (of OpenBLAS's rate " << gflops / blas << "; " << rounds
                << " alternating rounds)\n";
      out[key]["decode"][std::to_string(batch)] = {{"tokens_per_s", rate},
                                                   {"model_gflops", gflops},
                                                   {"ceiling_gflops", ceiling},
                                                   {"openblas_gflops", blas},
                                                   {"packed_gflops", packed},
                                                   {"efficiency", gflops / ceiling},
                                                   {"efficiency_of_openblas", gflops / blas},
                                                   {"rounds", rounds}};
    }
  }

  {
    // The decode step's loops balanced over the threads (a thread done with its share takes items from
    // another's; cpu_balanced.hpp) against split evenly, alternating on one model: on a quiet machine, and
    // with a thread that computes without pause on the first CPU this process may use, as a neighbour on a
    // shared machine takes part of one core (on a VM, such a neighbour is the hypervisor's, unseen).
    auto config = preset("small", vocab);
    policy_model model(config);
    model.init_random(1);
    int rounds = quick ? 2 : 4, steps = quick ? 24 : 48;
    for (bool neighbour : {false, true}) {
      std::atomic<bool> stop{false};
      std::thread busy;
      if (neighbour)
        busy = std::thread([&] {
          cpu_set_t allowed;
          if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
            for (int c = 0; c < CPU_SETSIZE; ++c)
              if (CPU_ISSET(c, &allowed)) {
                cpu_set_t one;
                CPU_ZERO(&one);
                CPU_SET(c, &one);
                sched_setaffinity(0, sizeof one, &one);
                break;
              }
          volatile uint64_t spin = 0;
          while (!stop.load(std::memory_order_relaxed))
            spin = spin + 1;
        });
      auto [balanced, even] = bench::measure_balanced_and_even(rounds, [&] { return decode_rate(model, 64, steps); });
      stop = true;
      if (busy.joinable())
        busy.join();
      std::cout << "  decode batch 64 (small), " << (neighbour ? "a busy thread on one CPU" : "quiet")
                << ": the step's loops balanced over the threads vs split evenly (" << rounds
                << " alternating runs each): " << balanced << " vs " << even << " tokens/s, ratio " << balanced / even
                << "\n";
      out["small"][neighbour ? "balanced_vs_even_beside_busy_thread" : "balanced_vs_even"] = balanced / even;
    }
  }

  // Batching and interruption on the tiny preset, long-tailed lengths.
  auto config = preset("tiny", vocab);
  policy_model model(config);
  model.init_random(2);
  int requests = quick ? 64 : 256;
  auto lengths = long_tail_lengths(requests, quick ? 16 : 32, quick ? 160 : 320, 7);
  std::vector<uint32_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  std::cout << "long-tail workload: " << requests << " requests, output length median " << sorted[sorted.size() / 2]
            << ", max " << sorted.back() << "\n";
  auto continuous = run_continuous(model, lengths, 32, interruption_mode::reprefill, 0);
  auto fixed = run_static(model, lengths, 32);
  std::cout << "  continuous batching " << continuous.useful_tokens_per_s << " tokens/s vs static "
            << fixed.useful_tokens_per_s << " tokens/s: ratio "
            << continuous.useful_tokens_per_s / fixed.useful_tokens_per_s << "\n";
  out["continuous_vs_static"] = continuous.useful_tokens_per_s / fixed.useful_tokens_per_s;

  // Cost of one interruption: 32 sequences with ~L tokens each re-prefilled.
  {
    generation_engine engine(model, {32, 16 + 512, 4096});
    for (uint64_t i = 0; i < 32; ++i)
      engine.submit(make_job(i, 16, 400));
    for (int i = 0; i < (quick ? 48 : 112); ++i)
      engine.step();
    auto start = clock_type::now();
    engine.step();
    double normal = seconds_since(start);
    uint64_t before = engine.counters().reprefill_tokens;
    engine.update_weights(1, model.flat().clone());
    start = clock_type::now();
    engine.step();
    double interrupted = seconds_since(start);
    double tokens = static_cast<double>(engine.counters().reprefill_tokens - before);
    double ms_per_1k = (interrupted - normal) * 1e3 / (tokens / 1000.0);
    std::cout << "  interruption: re-prefill of " << tokens << " tokens in flight costs " << ms_per_1k
              << " ms per 1k tokens (one step " << interrupted * 1e3 << " ms vs " << normal * 1e3 << " ms)\n";
    out["interruption_ms_per_1k_tokens"] = ms_per_1k;
  }
  // The three ways new weights meet in-flight sequences (rl.interruption), on
  // the same workload and update schedule (the same weights again, so that the
  // sampled lengths, and the work, are equal).
  int every = quick ? 24 : 40;
  auto reprefill = run_continuous(model, lengths, 32, interruption_mode::reprefill, every);
  auto keep_cache = run_continuous(model, lengths, 32, interruption_mode::keep_cache, every);
  auto waiting = run_continuous(model, lengths, 32, interruption_mode::wait, every);
  std::cout << "  weight update every " << every << " steps: reprefill " << reprefill.useful_tokens_per_s
            << " tokens/s, keep_cache " << keep_cache.useful_tokens_per_s << " tokens/s, wait "
            << waiting.useful_tokens_per_s << " tokens/s; reprefill/wait "
            << reprefill.useful_tokens_per_s / waiting.useful_tokens_per_s << ", keep_cache/wait "
            << keep_cache.useful_tokens_per_s / waiting.useful_tokens_per_s << ", keep_cache/reprefill "
            << keep_cache.useful_tokens_per_s / reprefill.useful_tokens_per_s << "\n";
  out["interrupt_vs_wait"] = reprefill.useful_tokens_per_s / waiting.useful_tokens_per_s;
  out["keep_cache_vs_wait"] = keep_cache.useful_tokens_per_s / waiting.useful_tokens_per_s;
  out["keep_cache_vs_reprefill"] = keep_cache.useful_tokens_per_s / reprefill.useful_tokens_per_s;

  // Shared group prompts: the pool against every sample prefilling its own prompt.
  {
    auto long_config = preset("tiny", vocab);
    long_config.max_position_embeddings = 4096;
    policy_model long_model(long_config);
    long_model.init_random(3);
    uint32_t new_tokens = quick ? 16 : 64;
    std::cout << "shared group prompts (tiny, 2 groups in flight, " << new_tokens
              << " new tokens per sample, prefill chunk 512):\n";
    for (int64_t prompt_len : {512, 2048})
      for (int64_t n : {8, 16}) {
        auto own = run_groups(long_model, prompt_len, n, 2, new_tokens, false);
        auto shared = run_groups(long_model, prompt_len, n, 2, new_tokens, true);
        double fewer = static_cast<double>(own.prefill_tokens) / static_cast<double>(shared.prefill_tokens);
        std::cout << "  prompt " << prompt_len << ", n = " << n << ": prompt tokens computed " << own.prefill_tokens
                  << " -> " << shared.prefill_tokens << " (" << fewer << "x fewer); " << own.tokens_per_s << " -> "
                  << shared.tokens_per_s << " tokens/s (" << shared.tokens_per_s / own.tokens_per_s << "x)\n";
        auto key = "shared_prompts_" + std::to_string(prompt_len) + "_n" + std::to_string(n);
        out[key] = {{"prefill_tokens_own", own.prefill_tokens},
                    {"prefill_tokens_shared", shared.prefill_tokens},
                    {"prefill_reduction", fewer},
                    {"tokens_per_s_own", own.tokens_per_s},
                    {"tokens_per_s_shared", shared.tokens_per_s},
                    {"speedup", shared.tokens_per_s / own.tokens_per_s}};
      }
  }

  // Resident memory over many decode steps with sequences constantly replaced.
  {
    generation_engine engine(model, {32, 16 + 128, 256});
    uint64_t next = 0;
    auto top_up = [&] {
      while (engine.queued() + engine.running() < 48) {
        engine.submit(make_job(next, 16, 8 + static_cast<uint32_t>(next % 100)));
        ++next;
      }
    };
    top_up();
    for (int i = 0; i < 200; ++i, top_up())
      engine.step();
    double before = resident_mb();
    int steps = quick ? 2000 : 10000;
    for (int i = 0; i < steps; ++i, top_up())
      engine.step();
    double after = resident_mb();
    std::cout << "  resident memory " << before << " MB after warm-up, " << after << " MB after " << steps
              << " more decode steps (" << next << " sequences): growth ratio " << after / before << "\n";
    out["rss_growth_ratio"] = after / before;
  }
  if (!json_path.empty())
    std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
