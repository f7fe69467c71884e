// A prompt that several samples of a micro-batch share (a group's) computed
// once in training, each response continuing it (policy_model::forward's
// parents, trainer_config::share_prompts): the same log-probabilities and
// gradient as every sample computed whole, on the CPU's own attention loops
// and on ATen's, at head sizes of both vector widths.
#include <stdexcept>
#include <string>

#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/trainer.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal::kernels;

namespace {

// Groups of samples with one prompt each, interleaved, and samples whose prompt is their own.
std::vector<rl_sample> grouped_batch() {
  std::vector<rl_sample> batch;
  uint64_t x = 11;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int32_t>((x >> 33) % 24);
  };
  std::vector<std::vector<int32_t>> prompts;
  for (int g = 0; g < 3; ++g) {
    std::vector<int32_t> p;
    for (int k = 0; k < 3 + 4 * g; ++k)
      p.push_back(next());
    prompts.push_back(p);
  }
  for (int i = 0; i < 14; ++i) {
    rl_sample s;
    if (i % 7 == 6)  // a prompt of its own
      for (int k = 0; k < 5; ++k)
        s.prompt.push_back(next());
    else
      s.prompt = prompts[static_cast<size_t>(i % 3)];
    for (int k = 0; k < 1 + (i * 5) % 9; ++k) {  // responses of 1 to 9 tokens
      s.response.push_back(next());
      s.behaviour_logprobs.push_back(-3.0f + 0.1f * static_cast<float>(k % 3));
    }
    s.advantage = (i % 3) - 1.0;
    batch.push_back(std::move(s));
  }
  return batch;
}

double relative(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

}  // namespace

TEST_CASE("a group's prompt computed once gives the log-probs and gradient of each sample computed whole") {
  auto batch = grouped_batch();
  std::vector<std::vector<int32_t>> prompts, responses;
  for (auto& s : batch) {
    prompts.push_back(s.prompt);
    responses.push_back(s.response);
  }
  for (int64_t hidden : {32, 64})  // head sizes 8 and 16: both vector widths of the attention loops
    for (bool fused_on : {true, false})
      for (int64_t threads : {1, 2}) {
        INFO("hidden " << hidden << ", the CPU's own loops " << fused_on << ", threads " << threads);
        fused::set_enabled(fused_on);
        auto config = areal::test::small_model_config(24);
        config.hidden_size = hidden;
        policy_model model(config);
        model.init_random(41, 0.2);
        trainer_config whole;
        whole.share_prompts = false;
        whole.data_parallel = threads;  // two threads: two micro-batches or more
        auto once = whole;
        once.share_prompts = true;

        trainer plain(model, whole);
        auto expected = plain.response_logprobs(prompts, responses);
        auto plain_stats = plain.ppo_gradients(batch);
        auto gradient = model.flat_grad().clone();
        model.flat_grad().zero_();

        trainer sharing(model, once);
        auto got = sharing.response_logprobs(prompts, responses);
        for (size_t i = 0; i < got.size(); ++i) {
          REQUIRE(got[i].size() == expected[i].size());
          for (size_t t = 0; t < got[i].size(); ++t)
            CHECK(std::abs(got[i][t] - expected[i][t]) <= 1e-5);
        }
        auto stats = sharing.ppo_gradients(batch);
        CHECK(relative(model.flat_grad(), gradient) <= 1e-5);
        CHECK(std::abs(stats.loss - plain_stats.loss) <= 1e-6);
        CHECK(stats.ppo.tokens == plain_stats.ppo.tokens);
        // The prompts were computed once per micro-batch: fewer tokens than whole.
        CHECK(stats.computed_tokens < plain_stats.computed_tokens);
        // Each group's prompt once (12 samples in 3 groups of 4: 9 prompts fewer of 3, 7 and 11 tokens, 3 of
        // each), and no response's last token (12 tokens): on two threads too, a group packed whole into
        // one micro-batch.
        CHECK(plain_stats.computed_tokens - stats.computed_tokens == 3 * (3 + 7 + 11) + 12);
        model.flat_grad().zero_();
      }
  fused::set_enabled(true);
}

TEST_CASE("a parent must be an earlier sequence that continues none") {
  policy_model model(areal::test::small_model_config(24));
  model.init_random(3, 0.1);
  auto tokens = at::arange(9, at::kLong) % 24;
  std::vector<int64_t> cu{0, 3, 6, 9};
  CHECK_NOTHROW(model.forward(tokens, cu, {-1, 0, 0}));
  auto refused = [&](std::vector<int64_t> parents, const std::string& why) {
    INFO(why);
    try {
      model.forward(tokens, cu, parents);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  refused({-1, 2, -1}, "a parent is -1 or an earlier sequence");
  refused({-1, 0, 1}, "which continues another");
  refused({-1, 0}, "2 parents for 3 sequences");
}
