// The trainer's AdamW step in the CPU's own loop (cpu::adamw, one pass per
// thread) against a float64 reference of the formula, on every instruction set
// this CPU runs, and in the trainer against ATen's composition of the same step.
#include <cmath>
#include <string>
#include <vector>

#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/trainer.hpp"
#include "cpu_isa.hpp"
#include "cpu_train_kernels.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal::kernels;

namespace {

std::vector<sft_sample> sft_data() {
  std::vector<sft_sample> data;
  for (int i = 0; i < 8; ++i) {
    sft_sample s;
    s.prompt = {1, static_cast<int32_t>(2 + i)};
    for (int k = 0; k < 6 + i; ++k)
      s.response.push_back(static_cast<int32_t>((i * 3 + k * 5) % 24));
    data.push_back(s);
  }
  return data;
}

}  // namespace

TEST_CASE("the AdamW loop takes the formula's step over its range and zeroes the gradient there") {
  auto detected = cpu::detect_isa();
  int64_t n = 1000, begin = 3, end = 997;  // ends off the vector widths
  cpu::adamw_step a{0.25f, 0.9f, 0.999f, 0.19f, 0.003f, 1e-8f, 1e-3f, 0.1f};
  for (auto set : cpu::runnable_isas()) {
    INFO("instruction set " << static_cast<int>(set));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    auto p = at::randn({n}, gen), g = at::randn({n}, gen), m = at::randn({n}, gen) * 0.1, v = at::rand({n}, gen) * 0.01;
    auto p0 = p.to(at::kDouble), g0 = g.to(at::kDouble), m0 = m.to(at::kDouble), v0 = v.to(at::kDouble);
    cpu::cpu_isa = set;
    cpu::adamw(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), begin, end, a);
    cpu::cpu_isa = detected;
    auto gs = g0 * a.grad_scale;
    auto want_m = m0 * a.beta1 + gs * (1 - static_cast<double>(a.beta1));
    auto want_v = v0 * a.beta2 + gs * gs * (1 - static_cast<double>(a.beta2));
    auto update = (want_m / a.bias1) / ((want_v / a.bias2).sqrt() + a.eps) + p0 * a.weight_decay;
    auto want_p = p0 - update * a.lr;
    auto inside = [&](const at::Tensor& t) { return t.narrow(0, begin, end - begin).to(at::kDouble); };
    auto outside = [&](const at::Tensor& t) {
      return at::cat({t.narrow(0, 0, begin), t.narrow(0, end, n - end)}).to(at::kDouble);
    };
    CHECK((inside(m) - inside(want_m)).abs().max().item<double>() < 1e-6);
    CHECK((inside(v) - inside(want_v)).abs().max().item<double>() < 1e-7);
    CHECK((inside(p) - inside(p0)).abs().max().item<double>() > 1e-4);      // the step moved them...
    CHECK((inside(p) - inside(want_p)).abs().max().item<double>() < 1e-6);  // ...as the formula does
    CHECK(inside(g).abs().max().item<double>() == 0);
    // Outside the range nothing moves.
    CHECK(at::equal(outside(p), outside(p0)));
    CHECK(at::equal(outside(g), outside(g0)));
    CHECK(at::equal(outside(m), outside(m0)));
  }
}

TEST_CASE(
    "the trainer's AdamW steps in the CPU's loop equal ATen's composition: clipped, decayed, on 1 and 2 threads") {
  for (int threads : {1, 2}) {
    INFO(threads << " thread(s)");
    auto config = areal::test::small_model_config(24);
    policy_model own(config), aten(config);
    own.init_random(7, 0.05);
    aten.flat().copy_(own.flat());
    auto start = own.flat().clone();
    trainer_config tc;
    tc.optimizer.lr = 1e-3;
    tc.optimizer.weight_decay = 0.1;
    tc.optimizer.max_grad_norm = 0.05;  // below the gradients' norm: every step is clipped
    tc.data_parallel = threads;
    trainer own_trainer(own, tc), aten_trainer(aten, tc);
    auto data = sft_data();
    for (int step = 0; step < 3; ++step) {
      auto s = own_trainer.sft_update(data);
      fused::set_enabled(false);  // ATen's layers and AdamW composition
      auto r = aten_trainer.sft_update(data);
      fused::set_enabled(true);
      CHECK(s.grad_norm > tc.optimizer.max_grad_norm);
      CHECK(s.grad_norm == doctest::Approx(r.grad_norm).epsilon(1e-5));
    }
    // The parameters moved the same way (the layers' rounding differs by about 1e-7 relative).
    auto moved = (own.flat() - start).to(at::kDouble), aten_moved = (aten.flat() - start).to(at::kDouble);
    CHECK(moved.norm().item<double>() > 0);
    CHECK((moved - aten_moved).norm().item<double>() < 1e-3 * aten_moved.norm().item<double>());
  }
}
