// The device-generic path: what a GPU runs, run on the device the environment
// names (AREAL_TEST_DEVICE: cpu, the default, or cuda[:N]). On the CPU the
// CPU's own loops are switched off, so that these tests take the ATen path a
// GPU takes and compare it with the CPU loops. Where CUDA is asked for and none
// is present the program exits with 77: CTest reports the test as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#define XXH_INLINE_ALL  // XXH3 on the host: the reference of the device's chunk checksums
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)
#include <torch/cuda.h>

#include "areal/kernels/device.hpp"
#include "areal/kernels/device_checksums.hpp"
#include "areal/kernels/engine.hpp"
#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/blas_core.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal::kernels;
using areal::sampling_params;

namespace {

std::string device_name() {
  auto* d = std::getenv("AREAL_TEST_DEVICE");
  return d && *d ? d : "cpu";
}

// The CPU's own loops serve one case's reference, then the generic path is back.
struct cpu_loops {
  cpu_loops() { fused::set_enabled(true); }
  ~cpu_loops() { fused::set_enabled(false); }
};

model_config device_model() {
  auto c = areal::test::small_model_config(48, 256);
  c.hidden_size = 64;
  c.intermediate_size = 128;
  return c;
}

std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  for (int k = 0; k < 4 + i % 7; ++k)
    p.push_back((i * 11 + k * 5) % 48);
  return p;
}

// Log-probabilities of each response token under a full (uncached) forward pass, in float32.
std::vector<float> scored(const policy_model& model, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& response) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  tokens.insert(tokens.end(), response.begin(), response.end());
  auto t = at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).to(model.flat().device());
  auto hidden = model.forward(t, {0, static_cast<int64_t>(tokens.size())});
  auto logp = at::log_softmax(model.logits(hidden).to(at::kFloat), -1).to(at::kCPU);
  std::vector<float> out;
  for (size_t j = 0; j < response.size(); ++j)
    out.push_back(logp[static_cast<int64_t>(prompt.size() + j - 1)][response[j]].item<float>());
  return out;
}

std::vector<rl_sample> ppo_batch(int n) {
  std::vector<rl_sample> batch;
  for (int i = 0; i < n; ++i) {
    rl_sample s;
    s.prompt = prompt_of(i);
    for (int k = 0; k < 5 + (i * 3) % 9; ++k) {
      s.response.push_back((i * 7 + k * 13) % 48);
      s.behaviour_logprobs.push_back(-3.8f);
    }
    s.advantage = i % 2 ? 1.0 : -1.0;
    batch.push_back(std::move(s));
  }
  return batch;
}

}  // namespace

TEST_CASE("an engine on the device generates what a full forward pass scores, in float32 and bfloat16") {
  for (std::string dtype : {"float32", "bfloat16"}) {
    INFO("dtype " << dtype);
    policy_model model(device_model(), tensor_options(device_name(), dtype));
    model.init_random(5, 0.15);
    REQUIRE(model.flat().device() == tensor_options(device_name(), dtype).device());
    generation_engine engine(model, {4, 256, 16});
    for (int i = 0; i < 6; ++i) {
      generation_job j;
      j.id = static_cast<uint64_t>(i);
      j.prompt = prompt_of(i);
      j.sampling.max_new_tokens = 20;
      j.sampling.greedy = i % 3 == 0;
      j.sampling.top_p = i % 3 == 1 ? 0.9f : 1.0f;
      j.seed = 40 + static_cast<uint64_t>(i);
      engine.submit(j);
    }
    auto outs = engine.run_to_completion();
    REQUIRE(outs.size() == 6);
    // bfloat16 carries 8 bits of mantissa and the cached and the full pass round
    // differently (measured here up to 0.06); a misplaced key or mask costs O(1).
    double tolerance = dtype == "float32" ? 2e-4 : 0.1;
    for (auto& out : outs) {
      CHECK(out.tokens.size() == 20);
      auto reference = scored(model, out.prompt, out.tokens);
      for (size_t t = 0; t < reference.size(); ++t)
        CHECK(std::abs(out.logprobs[t] - reference[t]) < tolerance);
    }
  }
}

TEST_CASE(
    "steady decode steps on a GPU (fused kernels replayed as CUDA graphs) generate what op-by-op steps generate") {
  auto config = device_model();
  config.max_position_embeddings = 1024;  // contexts past 256 keys: a second key bucket
  policy_model model(config, tensor_options(device_name(), "float32"));
  // Two rounds on one engine, new weights copied into the parameters in place
  // between them: the second round's graphs must read the new weights.
  auto generate = [&](bool graphs) {
    model.init_random(7, 0.15);
    engine_config ec{8, 512, 64};
    ec.cuda_graphs = graphs;
    generation_engine engine(model, ec);
    std::vector<generation_output> outs;
    for (int round = 0; round < 2; ++round) {
      if (round == 1)
        model.init_random(8, 0.15);
      for (int i = 0; i < 7; ++i) {  // different lengths: the batch shrinks through its buckets (padding rows)
        generation_job j;
        j.id = static_cast<uint64_t>(round * 10 + i);
        j.prompt = prompt_of(i);
        j.sampling.max_new_tokens = 30 + 45 * static_cast<uint32_t>(i);
        j.sampling.greedy = true;
        engine.submit(j);
      }
      auto done = engine.run_to_completion();
      outs.insert(outs.end(), done.begin(), done.end());
    }
    std::sort(outs.begin(), outs.end(), [](auto& a, auto& b) { return a.id < b.id; });
    return std::make_pair(outs, engine.counters());
  };
  // The reference: op by op, eagerly (on a GPU, no fused kernels either).
  set_cuda_kernels(false);
  auto [eager, eager_counters] = generate(false);
  set_cuda_kernels(true);
  auto [graphed, graph_counters] = generate(true);
  CHECK(eager_counters.graph_replays == 0);
  if (device_name() == "cpu") {
    CHECK(graph_counters.graph_replays == 0);  // no graphs on the CPU: the same eager steps
  } else {
    CHECK(graph_counters.graph_captures >= 4);  // batches 8, 4, 2, 1 at least
    CHECK(graph_counters.graph_replays > graph_counters.steps / 2);
  }
  REQUIRE(graphed.size() == eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    INFO("request " << eager[i].id);
    REQUIRE(graphed[i].tokens == eager[i].tokens);
    for (size_t t = 0; t < eager[i].logprobs.size(); ++t)
      CHECK(std::abs(graphed[i].logprobs[t] - eager[i].logprobs[t]) < 1e-4);
  }
}

TEST_CASE("an engine on a GPU other than the thread's current one generates what it does on the current one") {
  // A node's rollout worker i runs on its devices[i mod n] from any thread: the
  // fused kernels and the graphs must launch on their tensors' GPU, not on the
  // thread's current one (cuda:0 here).
  if (device_name() == "cpu" || torch::cuda::device_count() < 2) {
    MESSAGE("fewer than two GPUs: an engine on a GPU other than the current one not checked");
    return;
  }
  auto generate = [](const std::string& device, bool graphs) {
    policy_model model(device_model(), tensor_options(device, "float32"));
    model.init_random(11, 0.15);
    engine_config ec{4, 256, 16};
    ec.cuda_graphs = graphs;
    generation_engine engine(model, ec);
    for (int i = 0; i < 5; ++i) {
      generation_job j;
      j.id = static_cast<uint64_t>(i);
      j.prompt = prompt_of(i);
      j.sampling.max_new_tokens = 12 + 5 * static_cast<uint32_t>(i);
      j.sampling.greedy = true;
      engine.submit(j);
    }
    auto outs = engine.run_to_completion();
    std::sort(outs.begin(), outs.end(), [](auto& a, auto& b) { return a.id < b.id; });
    return outs;
  };
  for (bool graphs : {false, true}) {
    INFO("graphs " << graphs);
    auto here = generate("cuda:0", graphs);
    auto there = generate("cuda:1", graphs);
    REQUIRE(here.size() == there.size());
    for (size_t i = 0; i < here.size(); ++i)
      CHECK(here[i].tokens == there[i].tokens);
  }
}

namespace {

// Row i of `logits` with kinds[i mod kinds.size()]: what the CPU loop draws
// with a generator of `seed`, and the uniforms the engine draws from another
// generator of the same seed (none for greedy rows), as sample_rows takes them.
struct cpu_draws {
  std::vector<const sampling_params*> params;
  std::vector<double> uniforms;
  std::vector<sampled_token> expected;
};

cpu_draws draw_on_cpu(const at::Tensor& logits, const std::vector<sampling_params>& kinds, uint64_t seed) {
  auto reference_gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto uniform_gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  cpu_draws d;
  cpu_loops reference;
  for (int64_t i = 0; i < logits.size(0); ++i) {
    d.params.push_back(&kinds[static_cast<size_t>(i) % kinds.size()]);
    d.expected.push_back(sample_token(logits[i], *d.params.back(), reference_gen));
    bool greedy = d.params.back()->greedy;
    d.uniforms.push_back(greedy ? 0.0 : draw_uniform(uniform_gen));
  }
  return d;
}

// Rows drawn as the CPU loop drew them: the same token, the log-probability within `tolerance`.
int count_same(const std::vector<sampled_token>& drawn, const std::vector<sampled_token>& expected, double tolerance) {
  int same = 0;
  for (size_t i = 0; i < drawn.size(); ++i)
    if (drawn[i].token == expected[i].token && std::abs(drawn[i].logprob - expected[i].logprob) < tolerance)
      ++same;
  return same;
}

}  // namespace

TEST_CASE("the sampler on the device draws what the CPU loop draws") {
  auto logits = at::randn({64, 300}, at::TensorOptions().dtype(at::kFloat)) * 2.0;
  std::vector<sampling_params> kinds(3);
  kinds[1].top_k = 7;
  kinds[2].top_p = 0.8f;
  auto cpu = draw_on_cpu(logits, kinds, 3);
  auto drawn = sample_rows(logits.to(tensor_options(device_name(), "float32").device()), cpu.params, cpu.uniforms);
  CHECK(count_same(drawn, cpu.expected, 1e-4) >= 62);  // a uniform on a boundary between two tokens may round the other way
}

TEST_CASE("rows with no cut, at a real vocabulary, are drawn as the CPU loop draws them, in float32 and bfloat16") {
  // On a GPU these rows take the fused sampler (one kernel, the vocabulary in
  // chunks per thread); on the CPU the ATen path. Each row's largest logit
  // appears twice, far apart, so greedy rows check that the first one wins
  // (in rows 5 and 26 the kernel's halving reduction meets the later copy in
  // the lower slot: a tie rule that keeps the lower slot picks the second).
  constexpr int64_t rows = 48, vocab = 151936;
  auto logits = at::randn({rows, vocab}, at::TensorOptions().dtype(at::kFloat)) * 3.0;
  for (int64_t i = 0; i < rows; ++i) {
    auto first = (i * 4099) % (vocab / 2), second = first + vocab / 2 + i;
    logits[i][first] = 20.0;
    logits[i][second] = 20.0;
  }
  std::vector<sampling_params> kinds(3);
  kinds[1].temperature = 0.7f;
  kinds[2].greedy = true;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO("logits in " << (dtype == at::kFloat ? "float32" : "bfloat16"));
    auto rounded = logits.to(dtype).to(at::kFloat);  // what the sampler reads
    auto cpu = draw_on_cpu(rounded, kinds, 11);
    auto drawn =
        sample_rows(logits.to(tensor_options(device_name(), "float32").device()).to(dtype), cpu.params, cpu.uniforms);
    for (size_t i = 0; i < drawn.size(); ++i)
      if (cpu.params[i]->greedy) {
        CHECK(drawn[i].token == (static_cast<int64_t>(i) * 4099) % (vocab / 2));
        CHECK(drawn[i].token == cpu.expected[i].token);
      }
    CHECK(count_same(drawn, cpu.expected, 1e-3) >= rows - 2);  // a uniform on a boundary between two tokens may round the other way
  }
}

TEST_CASE("a PPO step's gradients on the device are the CPU loops' gradients, and bfloat16 products learn") {
  auto batch = ppo_batch(8);
  trainer_config tc;
  tc.optimizer.lr = 3e-3;
  tc.max_tokens_per_mb = 64;  // several micro-batches: gradients accumulate on the device
  auto make = [&](const std::string& device, const std::string& compute) {
    auto config = device_model();
    config.compute_dtype = compute;
    auto model = std::make_unique<policy_model>(config, tensor_options(device, "float32"));
    model->init_random(9, 0.2);
    return model;
  };
  auto gradients = [&](const std::string& device) {
    auto model = make(device, "float32");
    trainer t(*model, tc);
    auto stats = t.ppo_gradients(batch);
    return std::make_pair(stats.loss, model->flat_grad().to(at::kCPU).clone());
  };
  std::pair<double, at::Tensor> reference;
  {
    cpu_loops loops;
    reference = gradients("cpu");
  }
  auto on_device = gradients(device_name());
  CHECK(std::abs(on_device.first - reference.first) < 1e-5);
  auto scale = reference.second.abs().max().item<double>();
  REQUIRE(scale > 0);
  CHECK((on_device.second - reference.second).abs().max().item<double>() < 1e-4 * scale);

  // Optimizer steps on the device, products in bfloat16: the cross-entropy of a batch trained on falls.
  auto model = make(device_name(), "bfloat16");
  trainer t(*model, tc);
  std::vector<sft_sample> data;
  for (auto& s : batch)
    data.push_back({s.prompt, s.response, {}});
  auto first = t.sft_update(data).loss;
  double last = first;
  for (int i = 0; i < 5; ++i)
    last = t.sft_update(data).loss;
  CHECK(last < first - 0.05);
}

TEST_CASE("replicas on devices of their own train the weights the model alone trains") {
  // On a GPU: the model on AREAL_TEST_DEVICE and one replica on each other GPU
  // (the node's `devices`); on the CPU, two CPU replicas named the same way, so
  // that CTest runs the code path. Three steps of two minibatches: a replica's
  // weights left stale after a step, or a gradient sum that missed a device,
  // moves the weights elsewhere.
  auto own = device_name();
  std::vector<std::string> others;
  if (own == "cpu") {
    others = {"cpu", "cpu"};
  } else {
    auto index = tensor_options(own, "float32").device().index();
    for (int k = 0; k < static_cast<int>(torch::cuda::device_count()); ++k)
      if (k != std::max<int>(0, index))
        others.push_back("cuda:" + std::to_string(k));
  }
  if (others.empty()) {
    MESSAGE("one GPU: replicas on GPUs of their own not checked (they need two)");
    return;
  }
  auto batches = std::vector<std::vector<rl_sample>>{ppo_batch(8), ppo_batch(9), ppo_batch(10)};
  at::Tensor start;
  auto train = [&](const std::vector<std::string>& replica_devices, size_t* replicas) {
    policy_model model(device_model(), tensor_options(own, "float32"));
    model.init_random(17, 0.2);
    start = model.flat().to(at::kCPU).clone();
    trainer_config tc;
    tc.optimizer.lr = 3e-2;  // steps large enough that stale weights would show
    tc.ppo_minibatches = 2;
    tc.max_tokens_per_mb = 64;  // several micro-batches a pass, for every replica
    tc.replica_devices = replica_devices;
    trainer t(model, tc);
    for (auto& b : batches)
      t.ppo_update(b);
    *replicas = t.replica_count();
    return model.flat().to(at::kCPU).clone();
  };
  size_t alone_replicas = 0, spread_replicas = 0;
  auto alone = train({}, &alone_replicas);
  auto spread = train(others, &spread_replicas);
  CHECK(alone_replicas == 1);
  CHECK(spread_replicas == 1 + others.size());
  auto moved = (alone - start).norm().item<double>();
  REQUIRE(moved > 0);
  // Rounding: the sums' order differs, and AdamW's first steps magnify it (1.5e-4
  // on the CPU, where CPU replicas on threads give the same weights exactly).
  CHECK((spread - alone).norm().item<double>() / moved <= 1e-3);
}

TEST_CASE("the weight chunks' checksums computed on the device are XXH3-64 of their bytes") {
  auto options = tensor_options(device_name(), "float32");
  if (!options.device().is_cuda()) {
    CHECK_THROWS_AS(chunk_checksums_on_device(at::zeros({1024}, at::kByte), 256), std::invalid_argument);
    MESSAGE(
        "the CPU: the weight chunks' checksums on a GPU not checked (their two passes are checked against "
        "XXH3 on the host by test_weight_transport)");
    return;
  }
  auto check = [&](const at::Tensor& host, uint64_t chunk_bytes, const at::Tensor& on_device) {
    CAPTURE(host.numel());
    CAPTURE(chunk_bytes);
    auto sums = chunk_checksums_on_device(on_device, chunk_bytes).cpu();
    uint64_t total = static_cast<uint64_t>(host.numel()), chunks = (total + chunk_bytes - 1) / chunk_bytes;
    REQUIRE(static_cast<uint64_t>(sums.numel()) == chunks);
    for (uint64_t c = 0; c < chunks; ++c) {
      CAPTURE(c);
      auto size = std::min(chunk_bytes, total - c * chunk_bytes);
      CHECK(static_cast<uint64_t>(sums[static_cast<int64_t>(c)].item<int64_t>()) ==
            XXH3_64bits(host.data_ptr<uint8_t>() + c * chunk_bytes, size));
    }
  };
  at::manual_seed(5);
  uint64_t mib = uint64_t{1} << 20;
  // Chunks of the real size with a long tail, a tail of 240 bytes or less (hashed on the host), one short
  // chunk, none, chunks of 240 bytes or less, and bytes that start off an 8-byte boundary (all three hashed
  // on the host).
  for (auto [total, chunk] : std::vector<std::pair<uint64_t, uint64_t>>{{3 * 4 * mib + 1000, 4 * mib},
                                                                        {10000, 4096},
                                                                        {8192 + 100, 4096},
                                                                        {100, 4096},
                                                                        {0, 4096},
                                                                        {64 * mib, mib},
                                                                        {1000, 200}}) {
    auto host = at::randint(0, 256, {static_cast<int64_t>(total)}, at::kByte);
    check(host, chunk, host.to(options.device()));
  }
  auto host = at::randint(0, 256, {50001}, at::kByte);
  auto shifted = host.to(options.device()).narrow(0, 1, 50000);
  check(host.narrow(0, 1, 50000).contiguous(), 4096, shifted);
}

int main(int argc, char** argv) {
  areal::fit_blas_core(argc, argv);
  auto device = device_name();
  if (device != "cpu" && !cuda_available()) {
    std::cout << "AREAL_TEST_DEVICE=" << device << ": this LibTorch has no CUDA or sees no GPU; skipped\n";
    return 77;
  }
  fused::set_enabled(false);  // the path every device takes
  return doctest::Context(argc, argv).run();
}
