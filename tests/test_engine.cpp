// The generation engine: continuous batching gives each request what it would
// get alone; seeds reproduce; interruption re-prefills exactly and switches
// versions at the swap; sampling follows the truncated distribution.
#include <cmath>
#include <limits>
#include <map>

#include <ATen/CPUGeneratorImpl.h>

#include "areal/kernels/engine.hpp"
#include "areal/kernels/fused_layers.hpp"
#include "torch_doctest.hpp"

using namespace areal;
using namespace areal::kernels;

namespace {

model_config engine_config_model() {
  model_config c;
  c.vocab_size = 32;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = true;
  return c;
}

generation_job job(uint64_t id, std::vector<int32_t> prompt, uint32_t max_new, bool greedy = false, uint64_t seed = 0) {
  generation_job j;
  j.id = id;
  j.prompt = std::move(prompt);
  j.sampling.max_new_tokens = max_new;
  j.sampling.greedy = greedy;
  j.seed = seed ? seed : id + 100;
  return j;
}

std::map<uint64_t, generation_output> by_id(std::vector<generation_output> outs) {
  std::map<uint64_t, generation_output> m;
  for (auto& o : outs)
    m[o.id] = std::move(o);
  return m;
}

std::vector<int32_t> prompt_of(uint64_t i) {
  std::vector<int32_t> p;
  for (uint64_t k = 0; k < 3 + (i * 7) % 11; ++k)
    p.push_back(static_cast<int32_t>((i * 13 + k * 5) % 32));
  return p;
}

}  // namespace

TEST_CASE("continuous batching gives every request what it gets alone") {
  policy_model model(engine_config_model());
  model.init_random(11, 0.2);
  // Alone: one request at a time.
  std::map<uint64_t, generation_output> alone;
  for (uint64_t i = 0; i < 12; ++i) {
    generation_engine engine(model, {1, 128, 64});
    engine.submit(job(i, prompt_of(i), 4 + static_cast<uint32_t>(i * 5 % 17)));
    alone[i] = engine.run_to_completion().front();
  }
  // Together: 4 slots, small prefill chunks, requests of different lengths leaving at different times.
  generation_engine engine(model, {4, 128, 5});
  for (uint64_t i = 0; i < 12; ++i)
    engine.submit(job(i, prompt_of(i), 4 + static_cast<uint32_t>(i * 5 % 17)));
  auto together = by_id(engine.run_to_completion());
  REQUIRE(together.size() == 12);
  for (uint64_t i = 0; i < 12; ++i) {
    INFO("request " << i);
    CHECK(together[i].tokens == alone[i].tokens);
    CHECK(together[i].finish == finish_reason::length);
    CHECK(together[i].tokens.size() == 4 + i * 5 % 17);
    for (size_t t = 0; t < together[i].logprobs.size(); ++t)
      CHECK(std::abs(together[i].logprobs[t] - alone[i].logprobs[t]) < 1e-4);
  }
  CHECK(engine.counters().prefill_tokens > 0);
  CHECK(engine.idle());
}

TEST_CASE("the same seed and weights give the same tokens and stop tokens end a sequence") {
  policy_model model(engine_config_model());
  model.init_random(12, 0.3);
  auto run = [&](uint64_t seed) {
    generation_engine engine(model, {2, 128, 64});
    engine.submit(job(1, {1, 2, 3}, 40, false, seed));
    return engine.run_to_completion().front();
  };
  auto a = run(5), b = run(5), c = run(6);
  CHECK(a.tokens == b.tokens);
  CHECK(a.tokens != c.tokens);
  // Logprobs are log_softmax(logits / T) of the chosen tokens: negative, finite.
  for (auto lp : a.logprobs)
    CHECK((lp <= 0 && std::isfinite(lp)));
  // Stop at the first occurrence of a token the run produced.
  generation_engine engine(model, {2, 128, 64});
  auto with_stop = job(1, {1, 2, 3}, 40, false, 5);
  with_stop.sampling.stop_tokens = {a.tokens[3]};
  engine.submit(with_stop);
  auto stopped = engine.run_to_completion().front();
  CHECK(stopped.finish == finish_reason::stop);
  auto first = std::find(a.tokens.begin(), a.tokens.end(), a.tokens[3]) - a.tokens.begin();
  CHECK(stopped.tokens.size() == static_cast<size_t>(first + 1));
}

TEST_CASE("requests that cannot fit are refused with a reason") {
  policy_model model(engine_config_model());
  generation_engine engine(model, {2, 16, 8});
  CHECK_THROWS_WITH_AS(engine.submit(job(1, {}, 4)), doctest::Contains("empty prompt"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(engine.submit(job(2, {1, 2, 3}, 20)), doctest::Contains("exceeds the engine's max_seq_len"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(engine.submit(job(3, {99}, 2)), doctest::Contains("outside the vocabulary"),
                       std::invalid_argument);
  CHECK(engine.idle());
}

TEST_CASE("an interruption re-prefills exactly and switches versions at the swap") {
  policy_model model(engine_config_model());
  model.init_random(13, 0.2);
  policy_model other(engine_config_model());
  other.init_random(14, 0.2);
  auto new_weights = other.flat().clone();

  generation_engine engine(model, {1, 128, 64}, 0);
  engine.submit(job(1, {4, 5, 6, 7}, 30, false, 9));
  for (int i = 0; i < 10; ++i)
    engine.step();  // the prefill samples token 1, each later step one more
  auto before = engine.in_flight().front().tokens;
  REQUIRE(before.size() == 10);
  engine.update_weights(1, new_weights);
  engine.step();  // re-prefill of prompt + 10 tokens with the new weights, then token 11

  // The re-prefilled cache equals a fresh prefill of the same tokens with the new weights.
  std::vector<int64_t> tokens = {4, 5, 6, 7};
  tokens.insert(tokens.end(), before.begin(), before.end());
  auto n = static_cast<int64_t>(tokens.size());
  REQUIRE(engine.cache().length[0] == n);
  kv_cache fresh(other.config(), 1, 128, other.options());
  other.forward_cached(fresh, {tokens, {0}, {n}});
  double worst = 0;
  for (size_t l = 0; l < fresh.keys.size(); ++l) {
    worst = std::max(
        worst,
        (engine.cache().keys[l][0].narrow(1, 0, n) - fresh.keys[l][0].narrow(1, 0, n)).abs().max().item<double>());
    worst = std::max(
        worst,
        (engine.cache().values[l][0].narrow(1, 0, n) - fresh.values[l][0].narrow(1, 0, n)).abs().max().item<double>());
  }
  CHECK(worst <= 1e-5);

  auto out = engine.run_to_completion().front();
  REQUIRE(out.tokens.size() == 30);
  CHECK(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + 10) == before);
  for (size_t i = 0; i < out.versions.size(); ++i)
    CHECK(out.versions[i] == (i < 10 ? 0 : 1));  // versions switch exactly at the swap
  CHECK(engine.version() == 1);
  CHECK(engine.counters().interruptions == 1);
  CHECK(engine.counters().reprefill_tokens == 14);
}

TEST_CASE("keep_cache: the weights change under in-flight sequences, their caches stay, versions switch at the swap") {
  policy_model model(engine_config_model());
  model.init_random(13, 0.2);
  policy_model other(engine_config_model());
  other.init_random(14, 0.2);
  auto new_weights = other.flat().clone();

  generation_engine engine(model, {1, 128, 64, interruption_mode::keep_cache}, 0);
  engine.submit(job(1, {4, 5, 6, 7}, 30, false, 9));
  for (int i = 0; i < 10; ++i)
    engine.step();
  auto before = engine.in_flight().front().tokens;
  REQUIRE(before.size() == 10);
  int64_t n = 4 + 10 - 1;  // the last sampled token is fed at the next step
  REQUIRE(engine.cache().length[0] == n);
  auto old_keys = engine.cache().keys[0][0].narrow(1, 0, n).clone();
  engine.update_weights(1, new_weights);
  engine.step();  // no re-prefill: one decode step with the new weights
  CHECK(engine.cache().length[0] == n + 1);
  // The cached keys are still the old weights' (a re-prefill would have replaced them).
  CHECK((engine.cache().keys[0][0].narrow(1, 0, n) - old_keys).abs().max().item<double>() == 0.0);
  CHECK(model.flat().equal(new_weights));
  auto out = engine.run_to_completion().front();
  REQUIRE(out.tokens.size() == 30);
  for (size_t i = 0; i < out.versions.size(); ++i)
    CHECK(out.versions[i] == (i < 10 ? 0 : 1));
  CHECK(engine.counters().interruptions == 1);
  CHECK(engine.counters().reprefill_tokens == 0);
}

TEST_CASE("a swap to identical weights does not change the sampled tokens") {
  policy_model a(engine_config_model());
  a.init_random(15, 0.3);
  policy_model b(engine_config_model());
  b.flat().copy_(a.flat());
  generation_engine plain(a, {3, 128, 4});
  generation_engine swapped(b, {3, 128, 4});
  for (uint64_t i = 0; i < 5; ++i) {
    plain.submit(job(i, prompt_of(i), 25, false, 40 + i));
    swapped.submit(job(i, prompt_of(i), 25, false, 40 + i));
  }
  std::vector<generation_output> x, y;
  for (int step = 0; !plain.idle() || !swapped.idle(); ++step) {
    if (step == 7 || step == 19)
      swapped.update_weights(step, a.flat().clone());
    for (auto& o : plain.step())
      x.push_back(std::move(o));
    for (auto& o : swapped.step())
      y.push_back(std::move(o));
  }
  auto px = by_id(std::move(x)), py = by_id(std::move(y));
  REQUIRE(px.size() == 5);
  REQUIRE(py.size() == 5);
  for (uint64_t i = 0; i < 5; ++i)
    CHECK(px[i].tokens == py[i].tokens);
  CHECK(swapped.counters().interruptions == 2);
}

TEST_CASE("waiting mode finishes in-flight sequences with the old weights before swapping") {
  policy_model model(engine_config_model());
  model.init_random(16, 0.2);
  policy_model other(engine_config_model());
  other.init_random(17, 0.2);
  generation_engine engine(model, {2, 128, 64, interruption_mode::wait});
  engine.submit(job(1, {1, 2}, 12));
  engine.submit(job(2, {3, 4}, 6));
  engine.submit(job(3, {5, 6}, 6));  // queued: both slots are busy
  engine.step();
  engine.update_weights(1, other.flat().clone());
  auto outs = by_id(engine.run_to_completion());
  REQUIRE(outs.size() == 3);
  for (auto v : outs[1].versions)
    CHECK(v == 0);
  for (auto v : outs[2].versions)
    CHECK(v == 0);
  for (auto v : outs[3].versions)
    CHECK(v == 1);  // started only after the swap
  CHECK(engine.counters().interruptions == 0);
  CHECK(engine.counters().reprefill_tokens == 0);
}

TEST_CASE("top-k and top-p sampling follow the truncated distribution") {
  auto logits = at::tensor({2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -2.0f});
  auto probs = at::softmax(logits, 0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto chi_square = [&](const sampling_params& params, const std::vector<int64_t>& allowed) {
    const int draws = 20000;
    std::vector<int> counts(8, 0);
    for (int i = 0; i < draws; ++i) {
      auto s = sample_token(logits, params, gen);
      counts[static_cast<size_t>(s.token)]++;
      CHECK(std::abs(s.logprob - std::log(probs[s.token].item<float>())) < 1e-5);
    }
    double mass = 0;
    for (auto t : allowed)
      mass += probs[t].item<double>();
    double chi = 0;
    int outside = draws;
    for (auto t : allowed) {
      double expected = draws * probs[t].item<double>() / mass;
      chi += (counts[static_cast<size_t>(t)] - expected) * (counts[static_cast<size_t>(t)] - expected) / expected;
      outside -= counts[static_cast<size_t>(t)];
    }
    CHECK(outside == 0);  // nothing outside the truncation
    return chi;
  };
  sampling_params top_k;
  top_k.top_k = 3;
  CHECK(chi_square(top_k, {0, 1, 2}) < 13.82);  // chi-square, 2 degrees of freedom, p = 0.001
  sampling_params top_p;
  top_p.top_p = 0.7f;  // cumulative mass of the sorted probabilities crosses 0.7 at the third token
  CHECK(chi_square(top_p, {0, 1, 2}) < 13.82);
  sampling_params full;
  CHECK(chi_square(full, {0, 1, 2, 3, 4, 5, 6, 7}) < 24.32);  // 7 degrees of freedom, p = 0.001
  sampling_params greedy;
  greedy.greedy = true;
  CHECK(sample_token(logits, greedy, gen).token == 0);
  sampling_params hot;
  hot.temperature = 2.0f;
  auto s = sample_token(logits, hot, gen);
  CHECK(std::abs(s.logprob - at::log_softmax(logits / 2.0, 0)[s.token].item<float>()) < 1e-6);
}

TEST_CASE("top-p over a wide nucleus (more candidates than the first selection) keeps exactly the nucleus") {
  // 1,000 tokens with slowly falling logits: the nucleus at 0.9 holds hundreds of
  // them, so the sampler must grow its candidate set beyond the first 64.
  const int64_t vocab = 1000;
  auto logits = at::linspace(0.0, -3.0, vocab).to(at::kFloat);
  auto probs = at::softmax(logits, 0);
  // The reference nucleus by a full sort: tokens whose mass before them is below top_p.
  double before = 0;
  int64_t nucleus = 0;
  auto p = probs.accessor<float, 1>();
  while (nucleus < vocab && before < 0.9) {
    before += p[nucleus];
    ++nucleus;
  }
  REQUIRE(nucleus > 256);
  sampling_params params;
  params.top_p = 0.9f;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  int64_t highest = 0, beyond_first_selection = 0;
  for (int i = 0; i < 4000; ++i) {
    auto s = sample_token(logits, params, gen);
    highest = std::max(highest, s.token);
    beyond_first_selection += s.token >= 64;
    CHECK(std::abs(s.logprob - std::log(p[s.token])) < 1e-4);
  }
  CHECK(highest < nucleus);              // nothing outside the nucleus
  CHECK(highest > nucleus - 50);         // and its far end is reached
  CHECK(beyond_first_selection > 2000);  // most of its mass lies past the first 64 tokens
}

TEST_CASE("the sampler on the logits' device draws what the CPU loop draws, row by row") {
  // One batch of rows with different parameters, as an engine step has; the
  // reference is the CPU loop (sample_token) given the same uniform per row.
  const int64_t rows = 240, vocab = 700;
  auto logits = at::randn({rows, vocab}, at::TensorOptions().dtype(at::kFloat)) * 3.0;
  std::vector<sampling_params> kinds(8);
  kinds[1].temperature = 0.7f;
  kinds[2].top_k = 5;
  kinds[3].top_p = 0.8f;
  kinds[4].top_k = 50;
  kinds[4].top_p = 0.9f;
  kinds[5].greedy = true;
  kinds[6].temperature = 0.0f;  // greedy too
  kinds[7].temperature = 1.5f;
  kinds[7].top_p = 0.95f;
  auto reference_gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto uniform_gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<const sampling_params*> params;
  std::vector<double> uniforms;
  std::vector<sampled_token> expected;
  for (int64_t i = 0; i < rows; ++i) {
    auto& p = kinds[static_cast<size_t>(i % 8)];
    params.push_back(&p);
    expected.push_back(sample_token(logits[i], p, reference_gen));
    bool greedy = p.greedy || p.temperature <= 0;
    uniforms.push_back(greedy ? 0.0 : draw_uniform(uniform_gen));  // the engine's draw
  }
  auto drawn = sample_rows(logits, params, uniforms);
  REQUIRE(drawn.size() == static_cast<size_t>(rows));
  int same = 0;
  for (int64_t i = 0; i < rows; ++i) {
    auto& a = drawn[static_cast<size_t>(i)];
    auto& b = expected[static_cast<size_t>(i)];
    if (a.token != b.token)
      continue;  // a uniform on a boundary between two tokens, rounded differently
    ++same;
    CHECK(std::abs(a.logprob - b.logprob) < 1e-4);
  }
  CHECK(same >= rows - 2);
  // bfloat16 logits are drawn from too (a GPU step computes them so).
  CHECK(sample_rows(logits.to(at::kBFloat16), params, uniforms).size() == static_cast<size_t>(rows));
  auto broken = logits.narrow(0, 0, 2).clone();
  broken[1][3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH_AS(sample_rows(broken, {params[0], params[1]}, {0.5, 0.5}), doctest::Contains("row 1"),
                       std::runtime_error);
}

TEST_CASE("an engine on the ATen path (every device's path) generates what the CPU loops generate") {
  policy_model model(engine_config_model());
  model.init_random(13, 0.3);
  auto run = [&] {
    generation_engine engine(model, {4, 128, 16});
    for (uint64_t i = 0; i < 8; ++i) {
      auto j = job(i, prompt_of(i), 12, i % 4 == 3);
      j.sampling.top_k = i % 4 == 1 ? 6 : 0;
      j.sampling.top_p = i % 4 == 2 ? 0.85f : 1.0f;
      engine.submit(j);
    }
    return by_id(engine.run_to_completion());
  };
  auto cpu_loops = run();
  fused::set_enabled(false);
  auto aten = run();
  fused::set_enabled(true);
  REQUIRE(aten.size() == cpu_loops.size());
  for (auto& [id, out] : cpu_loops) {
    INFO("request " << id);
    CHECK(aten[id].tokens == out.tokens);
    for (size_t t = 0; t < out.logprobs.size() && t < aten[id].logprobs.size(); ++t)
      CHECK(std::abs(aten[id].logprobs[t] - out.logprobs[t]) < 1e-4);
  }
}

TEST_CASE("a generation saved part-way continues in another engine as it would have gone on") {
  policy_model model(engine_config_model());
  model.init_random(21, 0.3);
  for (bool greedy : {false, true}) {
    INFO("greedy " << greedy);
    generation_engine whole(model, {4, 128, 64}, 3);
    whole.submit(job(1, prompt_of(4), 30, greedy, 77));
    whole.submit(job(2, prompt_of(5), 30, greedy, 78));  // company in the batch changes nothing
    auto full = by_id(whole.run_to_completion())[1];
    REQUIRE(full.tokens.size() == 30);

    // The first engine stops after 12 steps (a checkpoint of the run takes the tokens so far)...
    generation_engine first(model, {4, 128, 64}, 3);
    first.submit(job(1, prompt_of(4), 30, greedy, 77));
    for (int i = 0; i < 12; ++i)
      first.step();
    auto* so_far = first.running_output(1);
    REQUIRE(so_far != nullptr);
    REQUIRE(so_far->tokens.size() > 5);
    REQUIRE(so_far->tokens.size() < 30);
    auto saved = *so_far;

    // ... and a new engine, at a later version, continues from them.
    generation_engine resumed(model, {4, 128, 64}, 5);
    auto again = job(1, prompt_of(4), 30, greedy, 77);
    again.so_far = {saved.tokens, saved.logprobs, saved.versions, finish_reason::unfinished};
    resumed.submit(again);
    auto out = resumed.run_to_completion().front();
    CHECK(out.tokens == full.tokens);
    REQUIRE(out.logprobs.size() == full.logprobs.size());
    for (size_t i = 0; i < out.logprobs.size(); ++i) {
      if (i < saved.tokens.size()) {
        CHECK(out.logprobs[i] == saved.logprobs[i]);  // kept as sampled
        CHECK(out.versions[i] == 3);
      } else {
        CHECK(out.logprobs[i] == doctest::Approx(full.logprobs[i]).epsilon(1e-4));
        CHECK(out.versions[i] == 5);
      }
    }
    // The saved tokens were computed again (with the prompt), not sampled again.
    CHECK(resumed.counters().decode_tokens == 30 - saved.tokens.size());
    CHECK(resumed.counters().reprefill_tokens == prompt_of(4).size() + saved.tokens.size());
  }
  // Output that cannot be continued is refused with a reason.
  generation_engine engine(model, {4, 128, 64});
  auto finished = job(1, {1, 2}, 10);
  finished.so_far = {{3}, {-0.5f}, {0}, finish_reason::stop};
  CHECK_THROWS_WITH_AS(engine.submit(finished), doctest::Contains("cannot be continued"), std::invalid_argument);
  auto full = job(1, {1, 2}, 2);
  full.so_far = {{3, 4}, {-0.5f, -0.5f}, {0, 0}, finish_reason::unfinished};
  CHECK_THROWS_AS(engine.submit(full), std::invalid_argument);
}

TEST_CASE("the counters say what the forward passes computed, as the simulator's cost model counts it") {
  policy_model model(engine_config_model());
  model.init_random(11, 0.2);
  generation_engine engine(model, {1, 64, 2});  // prompt chunks of 2 tokens
  engine.submit(job(1, {3, 4, 5, 6, 7}, 4));
  engine.run_to_completion();
  auto& c = engine.counters();
  // Chunks of 2 and 2 prompt tokens attend over 1+2 and 3+4 positions; then the
  // last prompt token and three sampled ones are fed one at a time over contexts of 5..8.
  CHECK(c.steps == 6);
  CHECK(c.prefill_tokens == 4);
  CHECK(c.prefill_attended_tokens == 10);
  CHECK(c.decode_rows == 4);
  CHECK(c.decode_context_tokens == 5 + 6 + 7 + 8);
}
