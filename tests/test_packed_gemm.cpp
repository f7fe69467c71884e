// The decode step's products over packed weights (cpu_packed_gemm.hpp): against
// a float64 reference on every instruction set this CPU runs, at shapes off the
// blockings; and in the model, where the packed copy must follow every change
// of the weights (an ATen write, the trainer's own optimizer loop).
#include <vector>

#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/kv_cache.hpp"
#include "areal/kernels/model.hpp"
#include "areal/kernels/trainer.hpp"
#include "cpu_isa.hpp"
#include "cpu_packed_gemm.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal::kernels;

TEST_CASE("a product over a packed weight is x times the weight transposed, with bias and accumulation") {
  auto detected = cpu::detect_isa();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  // Rows off the row blocks (8 and 3), columns off the 32-column blocks, depths off the unrolling.
  for (auto set : cpu::runnable_isas())
    for (int64_t m : {1, 5, 8, 13, 64, 2051})
      for (int64_t n : {1, 17, 32, 45, 100})
        for (int64_t k : {1, 7, 64}) {
          INFO("instruction set " << static_cast<int>(set) << ", m " << m << ", n " << n << ", k " << k);
          auto w = at::randn({n, k}, gen);
          auto x_wide = at::randn({m, k + 3}, gen);  // rows with a stride beyond k
          auto x = x_wide.narrow(1, 0, k);
          auto bias = at::randn({n}, gen);
          auto y0 = at::randn({m, n}, gen);
          std::vector<float> packed(static_cast<size_t>(cpu::packed_size(n, k)), -1.0f);
          cpu::cpu_isa = set;
          cpu::pack_weight(w.data_ptr<float>(), n, k, packed.data());
          auto plain = at::full({m, n}, 7.0f), summed = y0.clone();
          cpu::packed_product_args a;
          a.x = x_wide.data_ptr<float>();
          a.x_stride = k + 3;
          a.m = m;
          a.packed = packed.data();
          a.n = n;
          a.k = k;
          a.y = plain.data_ptr<float>();
          a.y_stride = n;
          cpu::packed_product(a);  // overwrites: the 7s go
          a.y = summed.data_ptr<float>();
          a.bias = bias.data_ptr<float>();
          a.accumulate = true;
          cpu::packed_product(a);
          cpu::cpu_isa = detected;
          auto want = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
          CHECK(at::allclose(plain.to(at::kDouble), want, 1e-5, 1e-5));
          CHECK(at::allclose(summed.to(at::kDouble), want + bias.to(at::kDouble) + y0.to(at::kDouble), 1e-5, 1e-5));
        }
}

TEST_CASE("a packed product takes an RMSNorm folded in, and the SwiGLU packing writes silu(gate) times up") {
  auto detected = cpu::detect_isa();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (auto set : cpu::runnable_isas())
    for (int64_t m : {1, 5, 8, 13})
      for (int64_t width : {1, 16, 17, 40})
        for (int64_t k : {1, 7, 64}) {
          INFO("instruction set " << static_cast<int>(set) << ", m " << m << ", width " << width << ", k " << k);
          auto x = at::randn({m, k}, gen);
          auto norm = at::rand({k}, gen) + 0.5;       // the norm's weight, folded into the packing
          auto row_scale = at::rand({m}, gen) + 0.5;  // each row's inverse RMS, given to the product
          auto w = at::randn({width, k}, gen), gate_up = at::randn({2 * width, k}, gen), bias = at::randn({width}, gen);
          std::vector<float> packed(static_cast<size_t>(cpu::packed_size(width, k)), -1.0f);
          std::vector<float> paired(static_cast<size_t>(cpu::packed_swiglu_size(width, k)), -1.0f);
          cpu::cpu_isa = set;
          cpu::pack_weight(w.data_ptr<float>(), width, k, packed.data(), norm.data_ptr<float>());
          cpu::pack_swiglu(gate_up.data_ptr<float>(), width, k, paired.data(), norm.data_ptr<float>());
          auto plain = at::full({m, width}, 7.0f), swiglu = at::full({m, width}, 7.0f);
          cpu::packed_product_args a;
          a.x = x.data_ptr<float>();
          a.x_stride = k;
          a.m = m;
          a.packed = packed.data();
          a.n = width;
          a.k = k;
          a.bias = bias.data_ptr<float>();
          a.row_scale = row_scale.data_ptr<float>();
          a.y = plain.data_ptr<float>();
          a.y_stride = width;
          cpu::packed_product(a);
          a.packed = paired.data();
          a.bias = nullptr;
          a.swiglu = true;
          a.y = swiglu.data_ptr<float>();
          cpu::packed_product(a);
          cpu::cpu_isa = detected;
          // The normalized rows times the plain weights, in float64.
          auto normed = x.to(at::kDouble) * row_scale.to(at::kDouble).unsqueeze(1) * norm.to(at::kDouble);
          auto want = at::mm(normed, w.to(at::kDouble).t()) + bias.to(at::kDouble);
          CHECK(at::allclose(plain.to(at::kDouble), want, 1e-5, 1e-5));
          auto halves = at::mm(normed, gate_up.to(at::kDouble).t()).chunk(2, 1);
          // A product of two inexact factors: its error scales with the factors, not with the product,
          // so the tolerance is relative to the largest value.
          auto want_swiglu = at::silu(halves[0]) * halves[1];
          auto largest = want_swiglu.abs().max().item<double>();
          CHECK(at::allclose(swiglu.to(at::kDouble), want_swiglu, 1e-5, 1e-5 * largest));
        }
}

namespace {

// The logits of one decode step (after a prefill of `prompt` tokens each) for 3 sequences, on the CPU's
// loops; with `prefill_too`, the prefill step's logits of every row before them.
at::Tensor decode_logits(const policy_model& model, int64_t prompt = 5, bool prefill_too = false) {
  kv_cache cache(model.config(), 3, prompt + 11, model.options());
  std::vector<int64_t> tokens;
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t t = 0; t < prompt; ++t)
      tokens.push_back((s * 7 + t * 3) % model.config().vocab_size);
  auto prefill = model.logits(model.forward_cached(cache, {tokens, {0, 1, 2}, {prompt, prompt, prompt}}));
  auto decode = model.logits(model.forward_cached(cache, {{1, 2, 3}, {0, 1, 2}, {1, 1, 1}}));
  return prefill_too ? at::cat({prefill, decode}) : decode;
}

// The same with ATen's products and layers (no packed weights).
at::Tensor aten_decode_logits(const policy_model& model, int64_t prompt = 5, bool prefill_too = false) {
  fused::set_enabled(false);
  auto out = decode_logits(model, prompt, prefill_too);
  fused::set_enabled(true);
  return out;
}

}  // namespace

TEST_CASE("the decode step's packed weights follow the model's weights as they change") {
  at::NoGradGuard no_grad;
  policy_model model(areal::test::small_model_config(24));
  model.init_random(1);
  auto before = decode_logits(model);
  CHECK(at::allclose(before, aten_decode_logits(model), 1e-4, 1e-5));

  SUBCASE("an ATen write into the weights") {
    policy_model other(areal::test::small_model_config(24));
    other.init_random(2);
    model.flat().copy_(other.flat());
    auto after = decode_logits(model);
    CHECK_FALSE(at::allclose(after, before, 1e-3, 1e-3));
    CHECK(at::allclose(after, aten_decode_logits(other), 1e-4, 1e-5));
  }
  SUBCASE("norm weights that are not ones (the packed products fold them into their weights)") {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
    for (auto name : {"model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
                      "model.norm.weight"})
      model.parameter(name).copy_(at::rand({model.config().hidden_size}, gen) + 0.5);
    auto after = decode_logits(model);
    CHECK_FALSE(at::allclose(after, before, 1e-3, 1e-3));
    CHECK(at::allclose(after, aten_decode_logits(model), 1e-4, 1e-5));
  }
  SUBCASE("a write into one parameter's view") {
    model.parameter("model.layers.1.mlp.down_proj.weight").mul_(3.0);
    auto after = decode_logits(model);
    CHECK_FALSE(at::allclose(after, before, 1e-3, 1e-3));
    CHECK(at::allclose(after, aten_decode_logits(model), 1e-4, 1e-5));
  }
}

TEST_CASE("a step of thousands of rows (a long prefill, a re-prefill of every sequence in flight) runs on the packed "
          "weights and gives ATen's logits") {
  // 3 x 700 rows: past the 1,024 rows at which steps once went to OpenBLAS, and off the row blocks.
  at::NoGradGuard no_grad;
  policy_model model(areal::test::small_model_config(24, 1024));
  model.init_random(3);
  auto packed = decode_logits(model, 700, true);
  REQUIRE(packed.size(0) == 3 * 700 + 3);
  CHECK(at::allclose(packed, aten_decode_logits(model, 700, true), 1e-4, 1e-5));
}

TEST_CASE("a model trained by the trainer's own optimizer loop decodes with its new weights") {
  policy_model model(areal::test::small_model_config(24));
  model.init_random(4);
  auto before = decode_logits(model);
  trainer_config config;
  config.optimizer.lr = 1e-2;
  trainer t(model, config);
  std::vector<sft_sample> data;
  for (int i = 0; i < 4; ++i)
    data.push_back({{1, static_cast<int32_t>(2 + i)}, {3, 4, 5, static_cast<int32_t>(6 + i)}, {}});
  t.sft_update(data);
  at::NoGradGuard no_grad;
  auto after = decode_logits(model);
  CHECK_FALSE(at::allclose(after, before, 1e-3, 1e-3));
  CHECK(at::allclose(after, aten_decode_logits(model), 1e-4, 1e-5));
}
