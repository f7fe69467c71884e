// bench_training: the trainer on this machine, measured side by side.
//   - the GEMM ceiling (fp32, the model's MLP shape, same threads);
//   - the PPO step the job's trainer runs (trainer::ppo_update: pi_prox where
//     it needs a pass, forward + backward, AdamW) with one replica per thread,
//     as the job's trainer on that many compute threads: tokens/s, model FLOPs
//     counted by forward_flops (bench_common.hpp: layers, LM head on scored
//     tokens, causal attention) and their fraction of the GEMM rate of as many
//     single-threaded products running at once; ppo_minibatches 1 and 4, and
//     1 with ATen's element-wise layers and attention instead of the CPU's own loops (fused_layers.hpp);
//   - the PPO step on groups of samples that share a prompt, the prompt computed
//     once per group vs with every sample (trainer_config::share_prompts);
//   - SFT steps (trainer::sft_update, forward + backward + AdamW) as the warm
//     start runs them, one replica per thread, FLOPs and ceiling as for the
//     PPO step, for both presets;
//   - packed vs padded micro-batches on long-tailed sequence lengths (useful tokens/s);
//   - the causal attention of a long-tailed packed micro-batch, its tasks balanced over the threads vs
//     split evenly;
//   - chunked vs naive log-probabilities at vocab 151,936: peak memory and time.
// Usage: bench_training [--quick] [--json FILE] [--threads N]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"

#include "areal/kernels/allocator.hpp"
#include "areal/kernels/blas_probe.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/logprobs.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/cpus.hpp"

using namespace areal::kernels;
using areal::bench::seconds_since;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int64_t vocab = 64;

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

std::vector<sft_sample> make_data(const std::vector<int64_t>& lengths, uint32_t seed) {
  std::mt19937 rng{seed};
  std::vector<sft_sample> data;
  for (auto len : lengths) {
    sft_sample s;
    s.prompt = {1, 2, 3, 4};
    for (int64_t k = 4; k < len; ++k)
      s.response.push_back(static_cast<int32_t>(rng() % vocab));
    data.push_back(std::move(s));
  }
  return data;
}

// Trained tokens/s over `steps` SFT steps on `data` (after one warm-up step).
double train_rate(policy_model& model, const trainer_config& tc, const std::vector<sft_sample>& data, int steps,
                  int64_t* computed = nullptr) {
  trainer t(model, tc);
  t.sft_update(data);
  int64_t tokens = 0, computed_tokens = 0;
  auto start = clock_type::now();
  for (int i = 0; i < steps; ++i) {
    auto s = t.sft_update(data);
    tokens += s.tokens;
    computed_tokens += s.computed_tokens;
  }
  auto rate = static_cast<double>(tokens) / seconds_since(start);
  if (computed)
    *computed = computed_tokens;
  model.set_trainable(false);
  return rate;
}

// A PPO batch of `groups` groups of `group_size` samples that share one prompt (as the job's GRPO
// groups do; prompt `prompt`, responses `response` tokens each), whose behaviour log-probabilities are
// the model's own, and advantages of both signs, as the trainer receives them.
std::vector<rl_sample> make_grouped_rl_batch(trainer& t, int groups, int group_size, int64_t prompt, int64_t response,
                                             uint32_t seed) {
  std::mt19937 rng{seed};
  std::vector<std::vector<int32_t>> prompts, responses;
  for (int g = 0; g < groups; ++g) {
    std::vector<int32_t> p;
    for (int64_t k = 0; k < prompt; ++k)
      p.push_back(static_cast<int32_t>(rng() % vocab));
    for (int i = 0; i < group_size; ++i) {
      std::vector<int32_t> r;
      for (int64_t k = 0; k < response; ++k)
        r.push_back(static_cast<int32_t>(rng() % vocab));
      prompts.push_back(p);
      responses.push_back(std::move(r));
    }
  }
  auto behaviour = t.response_logprobs(prompts, responses);
  std::vector<rl_sample> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    rl_sample s;
    s.prompt = prompts[i];
    s.response = responses[i];
    s.behaviour_logprobs = behaviour[i];
    s.advantage = i % 2 ? 1.0 : -1.0;
    batch.push_back(std::move(s));
  }
  return batch;
}

// A PPO batch of `count` sequences, each with a prompt of its own.
std::vector<rl_sample> make_rl_batch(trainer& t, int count, int64_t prompt, int64_t response, uint32_t seed) {
  return make_grouped_rl_batch(t, count, 1, prompt, response, seed);
}

}  // namespace

int main(int argc, char** argv) {
  auto cli = areal::bench::parse_options(argc, argv, "bench_training");
  bool quick = cli.quick;
  std::string json_path = cli.json_path;
  int threads = cli.threads;
  set_compute_threads(threads);
  nlohmann::json out;
  auto facts = probe_blas();
  std::cout << "machine: " << areal::cpus().describe() << "; " << describe(facts) << "\n";
  out["threads"] = facts.intra_op_threads;

  // Chunked vs naive log-probabilities at Qwen2's vocabulary (first, and chunked before naive: the peak RSS only
  // grows).
  {
    int64_t tokens = quick ? 1024 : 4096, hidden = 512, big_vocab = 151936;
    auto h = at::randn({tokens, hidden}).requires_grad_();
    auto w = (at::randn({big_vocab, hidden}) * 0.02).requires_grad_();
    auto targets = at::randint(big_vocab, {tokens}, at::kLong);
    auto run = [&](bool chunked) {
      auto start = clock_type::now();
      auto logp = chunked ? chunked_token_logprobs(h, w, targets) : naive_token_logprobs(h, w, targets);
      auto grads = torch::autograd::grad({logp.sum()}, {h, w});
      return seconds_since(start);
    };
    double base = peak_rss_mb();
    double chunked_s = run(true);
    double chunked_peak = peak_rss_mb() - base;
    double naive_s = run(false);
    double naive_peak = peak_rss_mb() - base;
    std::cout << "log-probs of " << tokens << " tokens x vocab " << big_vocab << " (hidden " << hidden
              << "), forward + backward: chunked " << chunked_s << " s, peak +" << chunked_peak << " MB; naive "
              << naive_s << " s, peak +" << naive_peak << " MB; memory ratio chunked/naive "
              << chunked_peak / naive_peak << ", time ratio " << chunked_s / naive_s << "\n";
    out["logprobs"] = {{"memory_ratio", chunked_peak / naive_peak}, {"time_ratio", chunked_s / naive_s}};
  }
  // Training runs with the tuned allocator (see allocator.hpp); the memory
  // comparison above ran with glibc's defaults, where freed blocks go back to the kernel.
  std::cout << "allocator for training: " << tune_allocator() << "\n";
  // The PPO step, as the job's trainer runs it on `threads` compute threads.
  {
    int count = quick ? 16 : 32;
    int64_t prompt = 64, response = 192;
    std::cout << "PPO step (trainer::ppo_update; " << threads << " replica(s) x 1 intra-op thread, as the job's "
              << "trainer on " << threads << " compute threads; " << count << " sequences of " << prompt << " + "
              << response << " tokens, max_tokens_per_mb 4096):\n";
    for (std::string name : {"tiny", "small"}) {
      auto config = preset(name, vocab);
      policy_model model(config);
      model.init_random(5);
      // The job's step (the CPU's own loops), and for one minibatch the same step with ATen's layers and attention.
      struct variant {
        int64_t minibatches;
        bool fused;
      };
      double fused_rate = 0;
      for (auto [minibatches, fused] : {variant{1, true}, variant{1, false}, variant{4, true}}) {
        fused::set_enabled(fused);
        trainer_config tc;
        tc.data_parallel = threads;
        tc.ppo_minibatches = minibatches;
        trainer t(model, tc);
        auto batch = make_rl_batch(t, count, prompt, response, 7);
        t.ppo_update(batch);  // warm-up
        int steps = quick ? 2 : 4;
        int64_t tokens = 0;
        // The ceiling brackets the timed steps (the mean of right before and right after): this machine's
        // speed drifts by a third within minutes, and a ceiling measured once per model landed in another.
        double ceiling = areal::bench::concurrent_gemm_ceiling_gflops(config, threads) / 2;
        auto start = clock_type::now();
        for (int i = 0; i < steps; ++i)
          tokens += t.ppo_update(batch).tokens;
        double seconds = seconds_since(start);
        ceiling += areal::bench::concurrent_gemm_ceiling_gflops(config, threads) / 2;
        // Per step: forward + backward (3x a forward) over the batch, and a
        // forward over the minibatches after the first (their pi_prox).
        std::vector<int64_t> lengths(static_cast<size_t>(count), prompt + response);
        double pass = areal::bench::forward_flops(config, lengths, count * response);
        auto first = static_cast<double>(count / minibatches) / count;
        double step_flops = 3.0 * pass + (1.0 - first) * pass;
        double gflops = step_flops * steps / seconds / 1e9;
        double efficiency = gflops / ceiling;
        double rate = tokens / seconds;
        std::string label = std::to_string(minibatches) + (fused ? "" : "_aten_layers");
        std::cout << "  " << name << ", ppo_minibatches " << minibatches
                  << (fused ? "" : ", ATen's element-wise layers and attention") << ": " << rate
                  << " trained tokens/s, " << gflops << " model GFLOP/s; ceiling " << ceiling << " GFLOP/s (" << threads
                  << " x 1-thread products at once, the mean of before and after the steps); efficiency " << efficiency;
        if (fused && minibatches == 1)
          fused_rate = rate;
        if (!fused)
          std::cout << "; fused layers " << fused_rate / rate << "x this";
        std::cout << "\n";
        out["ppo_step"][name][label] = {
            {"tokens_per_s", rate}, {"model_gflops", gflops}, {"ceiling_gflops", ceiling}, {"efficiency", efficiency}};
      }
      fused::set_enabled(true);
    }
  }
  // A group's prompt computed once in training (trainer_config::share_prompts) against with each of its
  // samples, the PPO step as above, alternating: the demo's shape (tiny; prompts of 7 tokens, responses
  // of 6, as its RL phase averages) and a long prompt (small; 256 + 32).
  {
    struct shape {
      const char* model;
      int64_t prompt, response;
    };
    int groups = quick ? 4 : 8, group_size = 8, rounds = quick ? 2 : 4, steps = quick ? 3 : 6;
    for (auto [name, prompt, response] : {shape{"tiny", 7, 6}, shape{"small", 256, 32}}) {
      policy_model model(preset(name, vocab));
      model.init_random(9);
      trainer_config once, whole;
      once.data_parallel = whole.data_parallel = threads;
      whole.share_prompts = false;
      trainer sharing(model, once), plain(model, whole);
      auto batch = make_grouped_rl_batch(plain, groups, group_size, prompt, response, 13);
      double rate[2] = {0, 0};
      int64_t computed[2] = {0, 0};
      for (auto* t : {&sharing, &plain})
        t->ppo_update(batch);  // warm-up
      for (int r = 0; r < rounds; ++r)
        for (int v = 0; v < 2; ++v) {
          auto& t = v == 0 ? sharing : plain;
          int64_t tokens = 0;
          auto start = clock_type::now();
          for (int i = 0; i < steps; ++i) {
            auto stats = t.ppo_update(batch);
            tokens += stats.tokens;
            computed[v] = stats.computed_tokens;
          }
          rate[v] += tokens / seconds_since(start) / rounds;
        }
      std::cout << "PPO step, " << name << ", " << groups << " groups of " << group_size
                << " samples sharing a prompt (" << prompt << " + " << response
                << " tokens): the prompt computed once per group vs with each sample (" << rounds
                << " alternating rounds): " << rate[0] << " vs " << rate[1] << " trained tokens/s, ratio "
                << rate[0] / rate[1] << "; tokens computed a step " << computed[0] << " vs " << computed[1] << "\n";
      out["shared_prompts"][name] = {{"shared_tokens_per_s", rate[0]},
                                     {"whole_tokens_per_s", rate[1]},
                                     {"ratio", rate[0] / rate[1]},
                                     {"shared_computed_tokens", computed[0]},
                                     {"whole_computed_tokens", computed[1]}};
    }
  }
  // SFT steps as the warm start runs them (one replica per compute thread): sequences of 256 tokens
  // (prompt 4), 2048 tokens per micro-batch. FLOPs as for the PPO step: forward_flops for the forward,
  // three times that for forward + backward.
  std::cout << "SFT step (trainer::sft_update; " << threads << " replica(s) x 1 intra-op thread, as the warm start on "
            << threads << " compute threads):\n";
  for (std::string name : {"tiny", "small"}) {
    auto config = preset(name, vocab);
    policy_model model(config);
    model.init_random(1);
    std::vector<int64_t> lengths(quick ? 8 : 16, 256);
    trainer_config tc;
    tc.max_tokens_per_mb = 2048;
    tc.data_parallel = threads;
    auto data = make_data(lengths, 1);
    int64_t scored = 0;
    for (auto& s : data)
      scored += static_cast<int64_t>(s.response.size());
    // The ceiling brackets the timed steps, as for the PPO step.
    double ceiling = areal::bench::concurrent_gemm_ceiling_gflops(config, threads) / 2;
    auto rate = train_rate(model, tc, data, quick ? 2 : 5);
    ceiling += areal::bench::concurrent_gemm_ceiling_gflops(config, threads) / 2;
    double step_flops = 3.0 * areal::bench::forward_flops(config, lengths, scored);
    double gflops = step_flops * rate / static_cast<double>(scored) / 1e9;
    double efficiency = gflops / ceiling;
    std::cout << "  " << name << ": " << config.parameter_count() << " parameters; " << rate << " trained tokens/s, "
              << gflops << " model GFLOP/s; ceiling " << ceiling << " GFLOP/s (" << threads
              << " x 1-thread products at once, the mean of before and after the steps); efficiency " << efficiency
              << "\n";
    out[name] = {
        {"ceiling_gflops", ceiling}, {"tokens_per_s", rate}, {"model_gflops", gflops}, {"efficiency", efficiency}};
  }

  // Packed vs padded on long-tailed lengths (tiny preset).
  {
    auto config = preset("tiny", vocab);
    policy_model model(config);
    model.init_random(2);
    std::mt19937 rng{3};
    std::lognormal_distribution<double> dist(std::log(64.0), 0.9);
    std::vector<int64_t> lengths;
    for (int i = 0; i < (quick ? 32 : 64); ++i)
      lengths.push_back(std::clamp<int64_t>(static_cast<int64_t>(dist(rng)), 8, 640));
    auto data = make_data(lengths, 4);
    trainer_config packed;
    packed.max_tokens_per_mb = 2048;
    trainer_config padded;
    padded.packed = false;
    padded.padded_mb_sequences = 8;
    int64_t packed_computed = 0, padded_computed = 0;
    auto packed_rate = train_rate(model, packed, data, quick ? 2 : 4, &packed_computed);
    auto padded_rate = train_rate(model, padded, data, quick ? 2 : 4, &padded_computed);
    std::cout << "long-tail lengths (median " <<
        [&] {
          auto s = lengths;
          std::sort(s.begin(), s.end());
          return s[s.size() / 2];
        }() << ", max "
              << *std::max_element(lengths.begin(), lengths.end()) << "): packed " << packed_rate
              << " tokens/s vs padded " << padded_rate << " tokens/s: ratio " << packed_rate / padded_rate
              << " (tokens computed: packed " << packed_computed << ", padded " << padded_computed << ")\n";
    out["packed_vs_padded"] = packed_rate / padded_rate;
  }

  // The attention of one long-tailed packed micro-batch on all the threads (as a trainer with one replica runs
  // it), its (sequence, head) tasks balanced over the threads (cpu_balanced.hpp) against split evenly.
  {
    std::vector<int64_t> lengths = {1024, 96, 80, 64, 64, 48, 48, 40, 32, 32, 32, 24, 24, 16, 16, 16};
    std::vector<int64_t> cu{0};
    for (auto l : lengths)
      cu.push_back(cu.back() + l);
    int64_t heads = 8, kv_heads = 2, head_dim = 64;
    auto qkv = at::randn({cu.back(), (heads + 2 * kv_heads) * head_dim}).requires_grad_(true);
    auto pass = [&] {
      fused::causal_attention(qkv, cu, heads, kv_heads, head_dim).sum().backward();
      qkv.mutable_grad().reset();
    };
    int rounds = quick ? 2 : 4, passes = quick ? 4 : 10;
    auto [balanced, even] = areal::bench::measure_balanced_and_even(rounds, [&] {
      pass();
      auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < passes; ++i)
        pass();
      return seconds_since(start) / passes;
    });
    std::cout << "causal attention of a long-tailed packed micro-batch (16 sequences, 1,024 tokens the longest, "
              << heads << " heads, " << kv_heads << " kv heads, forward + backward, " << at::get_num_threads()
              << " threads): tasks balanced over the threads " << balanced * 1e3 << " ms vs split evenly " << even * 1e3
              << " ms: " << even / balanced << "x\n";
    out["attention_balanced_vs_even"] = even / balanced;
  }

  if (!json_path.empty())
    std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
