// bench_device: the figures of a GPU check, measured on any device (cpu or
// cuda[:N]) with the engine and trainer the job runs, each beside the ceiling
// it is judged against, measured in the same run:
//   (a) the engine's log-probabilities against a float32 full forward pass of
//       the same weights: in float32 within a tolerance, in bfloat16 beside
//       what bfloat16 costs a full pass;
//   (b) decode tokens/s by batch, against the memory-bandwidth roofline: the
//       bytes a step must read (the weights once, every sequence's keys and
//       values) over the measured device copy rate ((read + write) bytes / s);
//       on a GPU also op by op, in CUDA graphs and eagerly, for the ratios;
//       each batch's step in parts timed alone (forward, the layers' products
//       alone, LM head, sampling; on a GPU sampling op by op beside the fused sampler);
//   (c) PPO training tokens/s, its model FLOP rate against the measured
//       bfloat16 GEMM rate (FLOPs as bench_common.hpp's forward_flops, x3),
//       and the step's parts timed alone (forward, body, backward, optimizer);
//   (d) on a GPU, the host staging of a weight transfer (device -> pinned host
//       -> device), the part of the host-staged path besides Gloo
//       (bench_weight_sync measures Gloo itself).
// Usage: bench_device [--device cpu|cuda[:N]] [--shape tiny|small|qwen2-0.5b]
//        [--quick] [--json FILE] [--threads N]
#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>

#include <torch/version.h>

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)
#include <ATen/record_function.h>
#include <nlohmann/json.hpp>

#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/device.hpp"
#include "areal/kernels/kv_cache.hpp"
#include "areal/kernels/sampling.hpp"
#include "areal/runtime/cpus.hpp"
#include "bench_common.hpp"

using namespace areal::kernels;
using areal::bench::seconds_since;
using clock_type = std::chrono::steady_clock;

namespace {

// A preset's shape, with random weights: Qwen2-0.5B's at its own vocabulary.
model_config shape_named(const std::string& name) {
  if (name == "qwen2-0.5b")
    return preset(name, 151936);
  auto c = preset(name, 1024);
  c.max_position_embeddings = 4096;
  return c;
}

// ATen operator calls on every thread while one is alive (RecordFunction's
// callback, nested calls included): on a GPU most are a kernel launch each.
class aten_call_counter {
 public:
  aten_call_counter()
      : handle_(at::addGlobalCallback(
            at::RecordFunctionCallback(&aten_call_counter::count).scopes({at::RecordScope::FUNCTION}))) {
    calls_ = 0;
  }
  ~aten_call_counter() { at::removeCallback(handle_); }
  aten_call_counter(const aten_call_counter&) = delete;
  aten_call_counter& operator=(const aten_call_counter&) = delete;
  uint64_t calls() const { return calls_; }

 private:
  static std::unique_ptr<at::ObserverContext> count(const at::RecordFunction&) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  static inline std::atomic<uint64_t> calls_{0};
  at::CallbackHandle handle_;
};

// (read + write) bytes per second of a device-to-device copy of `bytes`: the
// best of three rounds of `reps` copies (a ceiling is the best the device did).
double copy_bandwidth(const at::Device& device, int64_t bytes, int reps) {
  auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  auto src = at::ones({bytes / 4}, opts), dst = at::empty({bytes / 4}, opts);
  dst.copy_(src);
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    synchronize(device);
    auto start = clock_type::now();
    for (int i = 0; i < reps; ++i)
      dst.copy_(src);
    synchronize(device);
    best = std::max(best, 2.0 * static_cast<double>(bytes) * reps / seconds_since(start));
  }
  return best;
}

// FLOP/s of an n x n x n product in `type` on the device: the best of five
// rounds of `reps` products (one round of a few milliseconds on a shared CPU
// read 0.05 TFLOP/s once where it reads 0.17, and the PPO step "5.1x" of it).
double gemm_rate(const at::Device& device, at::ScalarType type, int64_t n, int reps) {
  auto opts = at::TensorOptions().dtype(type).device(device);
  auto a = at::randn({n, n}, opts), b = at::randn({n, n}, opts);
  auto c = at::mm(a, b);
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    synchronize(device);
    auto start = clock_type::now();
    for (int i = 0; i < reps; ++i)
      c = at::mm(a, b);
    synchronize(device);
    best = std::max(best, 2.0 * static_cast<double>(n) * n * n * reps / seconds_since(start));
  }
  return best;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t count, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < count; ++i)
    t.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
  return t;
}

// Log-probabilities of `tokens` after `prompt` under a full (uncached) forward pass of `model`.
at::Tensor full_pass_logprobs(const policy_model& model, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& tokens) {
  std::vector<int64_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), tokens.begin(), tokens.end());
  auto device = model.flat().device();
  auto t = at::tensor(all, at::TensorOptions().dtype(at::kLong)).to(device);
  auto hidden = model.forward(t, {0, static_cast<int64_t>(all.size())});
  auto rows = hidden.narrow(0, static_cast<int64_t>(prompt.size()) - 1, static_cast<int64_t>(tokens.size()));
  auto logp = at::log_softmax(model.logits(rows).to(at::kFloat), -1);
  auto picked = at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), at::TensorOptions().dtype(at::kLong));
  return logp.gather(1, picked.to(device).unsqueeze(1)).squeeze(1).to(at::kCPU).to(at::kDouble);
}

struct accuracy {
  double engine_max = 0;   // largest |engine log-prob - float32 full pass of the same weights|
  double engine_mean = 0;  // its mean
  double full_mean = 0;    // mean |full pass in the model's own type - float32 full pass|: the type's own cost
};

// (a) The engine against a float32 full pass of the same weights (a ragged
// batch: prompts of different lengths, as the engine's batch usually is).
accuracy engine_vs_forward(policy_model& model, int sequences, int64_t prompt, uint32_t new_tokens) {
  std::mt19937 rng{3};
  generation_engine engine(model, {sequences, prompt + 8 * sequences + new_tokens + 1, 1024});
  for (int i = 0; i < sequences; ++i) {
    generation_job j;
    j.id = static_cast<uint64_t>(i);
    j.prompt = random_tokens(rng, prompt + 7 * i, model.config().vocab_size);
    j.sampling.max_new_tokens = new_tokens;
    j.sampling.greedy = i % 2 == 0;
    j.seed = 10 + static_cast<uint64_t>(i);
    engine.submit(j);
  }
  auto outputs = engine.run_to_completion();
  at::NoGradGuard no_grad;
  policy_model exact(model.config(), model.options().dtype(at::kFloat));
  exact.flat().copy_(model.flat());  // the same weights in float32
  accuracy a;
  int64_t count = 0;
  for (auto& out : outputs) {
    auto truth = full_pass_logprobs(exact, out.prompt, out.tokens);
    auto full = full_pass_logprobs(model, out.prompt, out.tokens);
    auto engine_error = (at::tensor(out.logprobs).to(at::kDouble) - truth).abs();
    a.engine_max = std::max(a.engine_max, engine_error.max().item<double>());
    a.engine_mean += engine_error.sum().item<double>();
    a.full_mean += (full - truth).abs().sum().item<double>();
    count += truth.numel();
  }
  a.engine_mean /= static_cast<double>(std::max<int64_t>(count, 1));
  a.full_mean /= static_cast<double>(std::max<int64_t>(count, 1));
  return a;
}

struct decode_figures {
  double tokens_per_s = 0, step_s = 0, roofline_step_s = 0;
  uint64_t graph_replays = 0;
  double prefill_tokens_per_s = 0;  // the batch's prompts prefilled together, as after an interruption
  uint64_t prefill_aten_calls = 0;
};

// (b) Steady decoding of `batch` sequences, timed apart from their prefill (all
// prompts in the engine's first steps, as a re-prefill after an interruption).
// With `graphs`, steady steps replay captured CUDA graphs (on a GPU); the step
// that captures the batch's graph runs before the timing starts.
decode_figures decode_rate(policy_model& model, int64_t batch, int64_t prompt, uint32_t new_tokens,
                           double copy_bytes_per_s, bool graphs) {
  std::mt19937 rng{static_cast<uint32_t>(batch)};
  engine_config config{batch, prompt + new_tokens + 1, 4096};
  config.cuda_graphs = graphs;
  generation_engine engine(model, config);
  for (int64_t i = 0; i < batch; ++i) {
    generation_job j;
    j.id = static_cast<uint64_t>(i);
    j.prompt = random_tokens(rng, prompt, model.config().vocab_size);
    j.sampling.max_new_tokens = new_tokens;
    j.seed = 100 + static_cast<uint64_t>(i);
    engine.submit(j);
  }
  synchronize(model.flat().device());
  auto prefill_start = clock_type::now();
  uint64_t prefill_calls = 0;
  {
    aten_call_counter calls;
    while (engine.counters().prefill_tokens < static_cast<uint64_t>(batch * prompt))
      engine.step();
    prefill_calls = calls.calls();
  }
  synchronize(model.flat().device());
  double prefill_s = seconds_since(prefill_start);
  engine.step();  // the first steady step (where graphs are on: captures)
  auto tokens_before = engine.counters().decode_tokens;
  auto steps_before = engine.counters().steps;
  auto start = clock_type::now();
  while (!engine.idle())
    engine.step();
  double seconds = seconds_since(start);
  auto tokens = static_cast<double>(engine.counters().decode_tokens - tokens_before);
  auto steps = static_cast<double>(engine.counters().steps - steps_before);
  // Bytes a step must read: every parameter once (the LM head is the tied
  // embedding), and the keys and values of every sequence at its mean context.
  auto& c = model.config();
  double element = static_cast<double>(model.flat().element_size());
  double weights = static_cast<double>(c.parameter_count()) * element;
  double mean_context = static_cast<double>(prompt) + new_tokens / 2.0;
  double kv = static_cast<double>(batch) * mean_context * c.num_hidden_layers * 2.0 * c.num_key_value_heads *
              c.head_dim() * element;
  return {tokens / seconds,
          seconds / steps,
          (weights + kv) / copy_bytes_per_s,
          engine.counters().graph_replays,
          static_cast<double>(batch * prompt) / prefill_s,
          prefill_calls};
}

// Seconds per call of `work` on `device`: one untimed call first (a graph
// captured, buffers allocated), then `repeats` calls between two synchronizations.
template <typename Work>
double seconds_per_call(const at::Device& device, int repeats, Work&& work) {
  work();
  synchronize(device);
  auto start = clock_type::now();
  for (int i = 0; i < repeats; ++i)
    work();
  synchronize(device);
  return seconds_since(start) / repeats;
}

// The parts of a decode step of `batch` rows at `context` tokens, each timed
// alone (20 times, after a first call that captures the graph): the forward
// pass as the engine runs it (fused kernels and CUDA graphs where they are on),
// the LM head over the batch, and sampling (its one host round trip included).
struct step_parts {
  double forward_s = 0, lm_head_s = 0, sampling_s = 0;
  double products_s = 0;  // the layers' four products at the forward's shapes and type, alone (launched eagerly)
  double sampling_op_by_op_s = 0;  // with the fused kernels off (0 where none is built)
};

step_parts time_step_parts(policy_model& model, int64_t batch, int64_t context) {
  at::NoGradGuard no_grad;
  auto device = model.flat().device();
  constexpr int repeats = 20;
  kv_cache cache(model.config(), batch, context + repeats + 2, model.options());
  for (auto& length : cache.length)
    length = context;
  step_input input;
  for (int64_t b = 0; b < batch; ++b) {
    input.tokens.push_back((b * 7919) % model.config().vocab_size);
    input.slots.push_back(b);
    input.counts.push_back(1);
  }
  auto timed = [&](auto&& work) { return seconds_per_call(device, repeats, work); };
  at::Tensor hidden, logits;
  step_parts parts;
  parts.forward_s = timed([&] { hidden = model.forward_cached(cache, input); });
  parts.lm_head_s = timed([&] { logits = model.logits(hidden); });
  {
    // The products a layer runs (qkv, o, gate and up, down) on random operands
    // of its shapes: what the forward pass would cost if nothing but them ran.
    auto& c = model.config();
    auto kv_width = c.num_key_value_heads * c.head_dim();
    std::vector<std::pair<int64_t, int64_t>> shapes = {{c.hidden_size, c.hidden_size + 2 * kv_width},
                                                       {c.hidden_size, c.hidden_size},
                                                       {c.hidden_size, 2 * c.intermediate_size},
                                                       {c.intermediate_size, c.hidden_size}};
    auto options = hidden.options();
    std::vector<std::pair<at::Tensor, at::Tensor>> operands;
    for (auto [in, out] : shapes)
      operands.emplace_back(at::randn({batch, in}, options), at::randn({in, out}, options));
    parts.products_s = timed([&] {
      for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        for (auto& [a, w] : operands)
          at::mm(a, w);
    });
  }
  areal::sampling_params plain;
  std::vector<const areal::sampling_params*> params(static_cast<size_t>(batch), &plain);
  std::vector<double> uniforms(static_cast<size_t>(batch), 0.5);
  parts.sampling_s = timed([&] { sample_rows(logits, params, uniforms); });
  if (cuda_kernels_built() && device.is_cuda()) {
    set_cuda_kernels(false);
    parts.sampling_op_by_op_s = timed([&] { sample_rows(logits, params, uniforms); });
    set_cuda_kernels(true);
  }
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  auto device_name = areal::bench::take_flag(argc, argv, "--device", "cpu");
  auto shape = areal::bench::take_flag(argc, argv, "--shape", "");
  auto cli = areal::bench::parse_options(argc, argv, "bench_device [--device cpu|cuda[:N]] [--shape NAME]");
  bool gpu = device_name != "cpu";
  if (shape.empty())
    shape = gpu ? "qwen2-0.5b" : "tiny";
  set_compute_threads(cli.threads);
  at::Device device = tensor_options(device_name, "float32").device();  // refuses cuda without CUDA, saying so
  nlohmann::json out;
  auto facts = probe_blas();
  std::cout << "device: " << device_name << "; LibTorch " << TORCH_VERSION
            << (cuda_available() ? " with CUDA" : ", no CUDA") << "; " << areal::cpus().describe() << "; "
            << describe(facts) << "\n";
  out["device"] = device_name;
  out["libtorch"] = TORCH_VERSION;
  out["cuda"] = cuda_available();
  out["threads"] = facts.intra_op_threads;
  out["shape"] = shape;

  // Ceilings.
  int64_t copy_bytes = gpu ? (int64_t{1} << 30) : (int64_t{256} << 20);
  double copy = copy_bandwidth(device, copy_bytes, cli.quick ? 5 : 20);
  int64_t n = gpu ? 8192 : (cli.quick ? 512 : 1024);
  double bf16_gemm = gemm_rate(device, at::kBFloat16, n, gpu ? 50 : 3);
  double f32_gemm = gemm_rate(device, at::kFloat, n, gpu ? 20 : 3);
  std::cout << std::setprecision(4) << "ceilings: device copy " << copy / 1e9 << " GB/s ((read + write) bytes of a "
            << (copy_bytes >> 20) << " MiB copy); GEMM " << n << "^3: bfloat16 " << bf16_gemm / 1e12
            << " TFLOP/s, float32 " << f32_gemm / 1e12 << " TFLOP/s\n";
  out["copy_gb_per_s"] = copy / 1e9;
  out["gemm_tflops"] = {{"n", n}, {"bfloat16", bf16_gemm / 1e12}, {"float32", f32_gemm / 1e12}};

  auto config = shape_named(shape);
  std::cout << "model: " << shape << ", " << config.parameter_count() / 1e6 << " M parameters, vocabulary "
            << config.vocab_size << ", random weights\n";

  // (a) In float32 the engine must match the full pass (what finds a wrong cache
  // row or mask); in bfloat16 it must cost no more accuracy than the type itself
  // costs a full pass (its mean error within 1.5x of the full pass's, + 1e-3).
  {
    policy_model model(config, tensor_options(device_name, "float32"));
    model.init_random(1, 0.1);  // logits of a few units: rounding shows as it would in a trained model
    auto a = engine_vs_forward(model, 4, 64, cli.quick ? 8 : 32);
    const double tolerance = 2e-3;
    bool pass = a.engine_max <= tolerance;
    std::cout << "(a) float32 engine vs full pass: largest log-prob difference " << a.engine_max << " (tolerance "
              << tolerance << "): " << (pass ? "pass" : "FAIL") << "\n";
    out["engine_vs_forward"]["float32"] = {{"max_abs_diff", a.engine_max}, {"tolerance", tolerance}, {"pass", pass}};
  }
  // (b), and (a) in bfloat16: the rollout's model, parameters in bfloat16 on the device.
  {
    policy_model model(config, tensor_options(device_name, "bfloat16"));
    model.init_random(1, 0.1);
    auto a = engine_vs_forward(model, 4, 64, cli.quick ? 8 : 32);
    double bound = 1.5 * a.full_mean + 1e-3;
    bool pass = a.engine_mean <= bound;
    std::cout << "(a) bfloat16 engine vs a float32 full pass of the same weights: mean log-prob error " << a.engine_mean
              << "; a bfloat16 full pass's " << a.full_mean << "; bound " << bound << ": " << (pass ? "pass" : "FAIL")
              << "\n";
    out["engine_vs_forward"]["bfloat16"] = {
        {"engine_mean_error", a.engine_mean}, {"full_pass_mean_error", a.full_mean}, {"bound", bound}, {"pass", pass}};

    std::vector<int64_t> batches =
        gpu ? std::vector<int64_t>{1, 4, 16, 64, 128, 256}
            : (cli.quick ? std::vector<int64_t>{1, 16, 64} : std::vector<int64_t>{1, 4, 16, 64});
    int64_t prompt = cli.quick ? 64 : 128;
    uint32_t new_tokens = cli.quick ? 16 : 64;
    std::cout << "(b) decode, prompt " << prompt << " + " << new_tokens
              << " new tokens, against the roofline (weights + keys and values read once per step at the copy rate):\n";
    // On a GPU each batch three times, side by side: what the engine runs there
    // (fused kernels, steady steps replayed as CUDA graphs), the same op by op
    // in graphs, and op by op launched eagerly (no graphs, no fused kernels).
    for (auto batch : batches) {
      auto f = decode_rate(model, batch, prompt, new_tokens, copy, true);
      double efficiency = f.roofline_step_s / f.step_s;
      std::cout << "  batch " << batch << ": " << f.tokens_per_s << " tokens/s, step " << f.step_s * 1e3
                << " ms, roofline " << f.roofline_step_s * 1e3 << " ms, efficiency " << efficiency << "; prefill "
                << f.prefill_tokens_per_s << " tokens/s in " << f.prefill_aten_calls << " ATen calls\n";
      nlohmann::json row = {{"batch", batch},
                            {"tokens_per_s", f.tokens_per_s},
                            {"step_ms", f.step_s * 1e3},
                            {"roofline_step_ms", f.roofline_step_s * 1e3},
                            {"efficiency", efficiency},
                            {"graph_replays", f.graph_replays},
                            {"prefill_tokens_per_s", f.prefill_tokens_per_s},
                            {"prefill_aten_calls", f.prefill_aten_calls},
                            {"fused_kernels", cuda_kernels_built()}};
      auto parts = time_step_parts(model, batch, prompt + new_tokens / 2);
      std::cout << "    parts alone: forward " << parts.forward_s * 1e3 << " ms, LM head " << parts.lm_head_s * 1e3
                << " ms, sampling " << parts.sampling_s * 1e3 << " ms; the rest of the step (the engine's host work) "
                << (f.step_s - parts.forward_s - parts.lm_head_s - parts.sampling_s) * 1e3 << " ms\n";
      row["forward_ms"] = parts.forward_s * 1e3;
      row["lm_head_ms"] = parts.lm_head_s * 1e3;
      row["sampling_ms"] = parts.sampling_s * 1e3;
      std::cout << "    of the forward: the layers' products alone " << parts.products_s * 1e3
                << " ms; the rest (attention, norms, rotary, activation, launches) "
                << (parts.forward_s - parts.products_s) * 1e3 << " ms\n";
      row["layer_products_alone_ms"] = parts.products_s * 1e3;
      if (parts.sampling_op_by_op_s > 0) {
        std::cout << "    sampling op by op (ATen) " << parts.sampling_op_by_op_s * 1e3 << " ms: the fused sampler is "
                  << parts.sampling_op_by_op_s / parts.sampling_s << "x faster\n";
        row["sampling_op_by_op_ms"] = parts.sampling_op_by_op_s * 1e3;
      }
      if (f.graph_replays > 0) {
        set_cuda_kernels(false);
        auto graphs_only = decode_rate(model, batch, prompt, new_tokens, copy, true);
        auto eager = decode_rate(model, batch, prompt, new_tokens, copy, false);
        set_cuda_kernels(true);
        std::cout << "    op by op: in CUDA graphs " << graphs_only.tokens_per_s << " tokens/s (step "
                  << graphs_only.step_s * 1e3 << " ms), eager " << eager.tokens_per_s << " tokens/s (step "
                  << eager.step_s * 1e3 << " ms); fused + graphs = " << f.tokens_per_s / graphs_only.tokens_per_s
                  << "x graphs alone, " << f.tokens_per_s / eager.tokens_per_s << "x eager\n";
        row["graphs_op_by_op_tokens_per_s"] = graphs_only.tokens_per_s;
        row["eager_op_by_op_tokens_per_s"] = eager.tokens_per_s;
        row["eager_step_ms"] = eager.step_s * 1e3;
        row["speedup_over_eager"] = f.tokens_per_s / eager.tokens_per_s;
      }
      out["decode"].push_back(row);
    }
  }

  // (c) The trainer: float32 master weights and optimizer state on the device, bfloat16 products.
  {
    auto train_config = config;
    train_config.compute_dtype = "bfloat16";
    policy_model model(train_config, tensor_options(device_name, "float32"));
    model.init_random(2, 0.02);
    trainer_config tc;
    tc.max_tokens_per_mb = gpu ? 16384 : 2048;
    trainer t(model, tc);
    int count = gpu ? 32 : 8;
    int64_t prompt = gpu ? 256 : 32, response = gpu ? 768 : 96;
    std::mt19937 rng{5};
    std::vector<rl_sample> batch;
    for (int i = 0; i < count; ++i) {
      rl_sample s;
      s.prompt = random_tokens(rng, prompt, config.vocab_size);
      s.response = random_tokens(rng, response, config.vocab_size);
      s.behaviour_logprobs.assign(static_cast<size_t>(response), -12.0f);
      s.advantage = i % 2 ? 1.0 : -1.0;
      batch.push_back(std::move(s));
    }
    uint64_t step_calls = 0;
    {
      aten_call_counter calls;
      t.ppo_update(batch);  // warm-up, its ATen calls counted
      synchronize(device);
      step_calls = calls.calls();
    }
    int steps = cli.quick ? 1 : 3;
    int64_t tokens = 0;
    auto start = clock_type::now();
    for (int i = 0; i < steps; ++i)
      tokens += t.ppo_update(batch).tokens;
    synchronize(device);
    double seconds = seconds_since(start);
    std::vector<int64_t> lengths(static_cast<size_t>(count), prompt + response);
    double flops = 3.0 * areal::bench::forward_flops(config, lengths, count * response) * steps;  // forward + backward
    double rate = flops / seconds;
    std::cout << "(c) PPO step, " << count << " x (" << prompt << " + " << response << ") tokens: " << tokens / seconds
              << " trained tokens/s, " << rate / 1e12 << " model TFLOP/s = " << rate / bf16_gemm
              << " of the bfloat16 GEMM rate; " << step_calls << " ATen calls a step\n";
    out["training"] = {{"trained_tokens_per_s", tokens / seconds},
                       {"aten_calls_per_step", step_calls},
                       {"model_tflops", rate / 1e12},
                       {"fraction_of_bf16_gemm", rate / bf16_gemm}};

    // Where the step's time goes, each part timed alone on the same batch: the
    // forward pass without gradient as the proximal pass runs it (the body,
    // the LM head and the log-probabilities), the body alone on the same
    // micro-batches, forward and backward (ppo_gradients: no optimizer step),
    // and the optimizer step as the rest of ppo_update.
    auto time_of = [&](auto&& work) { return seconds_per_call(device, steps, work); };
    auto per_mb = std::max<int64_t>(1, tc.max_tokens_per_mb / (prompt + response));
    std::vector<std::pair<at::Tensor, std::vector<int64_t>>> micro_batches;
    for (int first = 0; first < count; first += static_cast<int>(per_mb)) {
      std::vector<int64_t> ids, cu{0};
      for (int i = first; i < std::min<int>(count, first + static_cast<int>(per_mb)); ++i) {
        for (auto* part : {&batch[static_cast<size_t>(i)].prompt, &batch[static_cast<size_t>(i)].response})
          ids.insert(ids.end(), part->begin(), part->end());
        cu.push_back(static_cast<int64_t>(ids.size()));
      }
      micro_batches.emplace_back(at::tensor(ids).to(device), cu);
    }
    double forward_s = time_of([&] { t.proximal_logprobs(batch); });
    double body_s = time_of([&] {
      at::NoGradGuard no_grad;
      for (auto& [ids, cu] : micro_batches)
        model.forward(ids, cu);
    });
    double gradients_s = time_of([&] { t.ppo_gradients(batch); });
    double step_s = seconds / steps;
    double logprob_flops = areal::bench::forward_flops(config, lengths, count * response);
    double body_flops = areal::bench::forward_flops(config, lengths, 0);
    auto share = [&](double part_flops, double s) { return part_flops / s / bf16_gemm; };
    std::cout << "    parts alone: forward without gradient " << forward_s * 1e3 << " ms ("
              << share(logprob_flops, forward_s) << " of the GEMM rate), of it the body " << body_s * 1e3 << " ms ("
              << share(body_flops, body_s) << ") and the LM head with log-probabilities " << (forward_s - body_s) * 1e3
              << " ms (" << share(logprob_flops - body_flops, forward_s - body_s) << "); forward + backward "
              << gradients_s * 1e3 << " ms (the backward " << share(2 * logprob_flops, gradients_s - forward_s)
              << "); the optimizer step and the rest " << (step_s - gradients_s) * 1e3 << " ms of the step's "
              << step_s * 1e3 << " ms\n";
    out["training"]["parts_ms"] = {{"forward_no_gradient", forward_s * 1e3},
                                   {"body_no_gradient", body_s * 1e3},
                                   {"forward_backward", gradients_s * 1e3},
                                   {"step", step_s * 1e3},
                                   {"optimizer_and_rest", (step_s - gradients_s) * 1e3}};
  }

  // (d) Host staging of a weight transfer (device -> pinned host -> device).
  if (device.is_cuda()) {
    auto bytes = config.parameter_count() * 2;  // bfloat16 weights
    auto on_device = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    auto host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    host.copy_(on_device);
    synchronize(device);
    auto start = clock_type::now();
    host.copy_(on_device);
    synchronize(device);
    double d2h = static_cast<double>(bytes) / seconds_since(start);
    start = clock_type::now();
    on_device.copy_(host);
    synchronize(device);
    double h2d = static_cast<double>(bytes) / seconds_since(start);
    std::cout << "(d) host staging of " << bytes / 1e6 << " MB of weights: device to pinned host " << d2h / 1e9
              << " GB/s, back " << h2d / 1e9 << " GB/s (one GPU: NCCL needs two; Gloo: bench_weight_sync)\n";
    out["staging"] = {{"bytes", bytes}, {"device_to_host_gb_per_s", d2h / 1e9}, {"host_to_device_gb_per_s", h2d / 1e9}};
  } else {
    std::cout << "(d) host staging: the weights are already in host memory on the CPU\n";
  }

  if (!cli.json_path.empty())
    std::ofstream(cli.json_path) << out.dump(2) << "\n";
  return 0;
}
