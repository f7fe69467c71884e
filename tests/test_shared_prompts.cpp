// Shared group prompts in the generation engine: the members of a group read
// their common prompt from the KV cache's pool, prefilled once, and get the
// tokens and log-probabilities they would get each alone; interruptions, the
// next turn of a conversation, a full pool and the ATen path (other dtypes)
// keep that true.
#include <cmath>
#include <map>

#include "areal/kernels/engine.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal;
using namespace areal::kernels;

namespace {

model_config shared_prompt_model() {
  return test::small_model_config(32, 256);
}

std::vector<int32_t> long_prompt(uint32_t salt, size_t length) {
  std::vector<int32_t> p;
  for (size_t k = 0; k < length; ++k)
    p.push_back(static_cast<int32_t>((salt * 11 + k * 7 + k * k) % 32));
  return p;
}

generation_job job(uint64_t id, std::vector<int32_t> prompt, uint32_t max_new, uint64_t seed) {
  generation_job j;
  j.id = id;
  j.prompt = std::move(prompt);
  j.sampling.max_new_tokens = max_new;
  j.seed = seed;
  return j;
}

// A group of `members` on one prompt (different seeds) plus two unrelated requests.
std::vector<generation_job> workload(size_t prompt_length, uint64_t members) {
  std::vector<generation_job> jobs;
  for (uint64_t m = 0; m < members; ++m)
    jobs.push_back(job(m, long_prompt(1, prompt_length), 6 + static_cast<uint32_t>(m * 3 % 7), 500 + m));
  jobs.push_back(job(100, long_prompt(2, 9), 5, 77));
  jobs.push_back(job(101, long_prompt(3, prompt_length / 2), 8, 78));
  return jobs;
}

std::map<uint64_t, generation_output> run(policy_model& model, engine_config config,
                                          const std::vector<generation_job>& jobs,
                                          const std::vector<std::pair<int, at::Tensor>>& updates = {},
                                          engine_counters* counters = nullptr) {
  generation_engine engine(model, config);
  for (auto& j : jobs)
    engine.submit(j);
  std::map<uint64_t, generation_output> out;
  for (int step = 0; !engine.idle(); ++step) {
    REQUIRE(step < 10000);
    for (auto& [at_step, weights] : updates)
      if (step == at_step)
        engine.update_weights(step, weights);
    for (auto& o : engine.step())
      out[o.id] = std::move(o);
  }
  if (counters)
    *counters = engine.counters();
  return out;
}

void check_same(std::map<uint64_t, generation_output>& a, std::map<uint64_t, generation_output>& b) {
  REQUIRE(a.size() == b.size());
  for (auto& [id, x] : a) {
    INFO("request " << id);
    auto& y = b.at(id);
    CHECK(x.tokens == y.tokens);
    CHECK(x.versions == y.versions);
    REQUIRE(x.logprobs.size() == y.logprobs.size());
    for (size_t t = 0; t < x.logprobs.size(); ++t)
      CHECK(std::abs(x.logprobs[t] - y.logprobs[t]) < 1e-4);
  }
}

engine_config sharing(int64_t slots, int64_t chunk, int64_t pool) {
  engine_config c{slots, 200, chunk};
  c.prompt_pool_tokens = pool;
  c.min_shared_prompt = 8;
  return c;
}

}  // namespace

TEST_CASE("a group reads its prompt from the pool, prefilled once, and gets what each member gets alone") {
  policy_model model(shared_prompt_model());
  model.init_random(21, 0.2);
  auto jobs = workload(40, 6);
  engine_counters with{}, without{};
  // 4 slots for 8 requests: two members start later, from the entry the first four made;
  // chunks of 16 spread the pool's prefill over several steps.
  auto shared = run(model, sharing(4, 16, 128), jobs, {}, &with);
  auto alone = run(model, {4, 200, 16}, jobs, {}, &without);
  check_same(shared, alone);
  // Alone: every member prefills its 40 prompt tokens. Shared: all 40 once, in
  // the pool, whose last row's logits give every member its first token.
  CHECK(without.prefill_tokens == 6 * 40 + 9 + 20);
  CHECK(with.prefill_tokens == 40 + 9 + 20);
  CHECK(with.shared_prompt_tokens == 6 * 40);
  CHECK(without.shared_prompt_tokens == 0);
  CHECK(with.pool_first_tokens == 6);
  CHECK(without.pool_first_tokens == 0);
  // Rows the forward passes computed (prompt rows, and a row per sampled token
  // fed back): exactly five prompts fewer, no row per member for the prompt's end.
  CHECK(with.prefill_tokens + with.decode_rows == without.prefill_tokens + without.decode_rows - 5 * 40);
}

TEST_CASE("members that arrive after the first one started make the entry from its rows, without computing") {
  policy_model model(shared_prompt_model());
  model.init_random(27, 0.2);
  auto jobs = workload(40, 5);
  // One request per step, as a rollout worker receives them between its steps.
  generation_engine engine(model, sharing(8, 256, 128));
  std::map<uint64_t, generation_output> shared;
  size_t next = 0;
  for (int step = 0; !engine.idle() || next < jobs.size(); ++step) {
    REQUIRE(step < 1000);
    if (next < jobs.size())
      engine.submit(jobs[next++]);
    for (auto& o : engine.step())
      shared[o.id] = std::move(o);
  }
  auto alone = run(model, {8, 200, 256}, jobs);
  check_same(shared, alone);
  // The first member prefills its 40 tokens alone; the second copies them into
  // the pool; all later members read them there. The copy keeps no logits: each
  // member reads 39 rows and computes the prompt's last one itself.
  CHECK(engine.counters().prefill_tokens == 40 + 9 + 20);
  CHECK(engine.counters().pool_copied_tokens == 40);
  CHECK(engine.counters().shared_prompt_tokens == 4 * 39);
  CHECK(engine.counters().pool_first_tokens == 0);
}

TEST_CASE("after an interruption the group re-prefills its prompt once, with the new weights") {
  policy_model model(shared_prompt_model()), copy(shared_prompt_model());
  model.init_random(22, 0.2);
  policy_model other(shared_prompt_model());
  other.init_random(23, 0.2);
  copy.flat().copy_(model.flat());
  auto jobs = workload(30, 4);
  std::vector<std::pair<int, at::Tensor>> updates = {{5, other.flat().clone()}};
  engine_counters with{}, without{};
  // Chunks large enough that both engines prefill everything in the first step:
  // the update then meets both at the same tokens.
  auto shared = run(model, sharing(8, 256, 128), jobs, updates, &with);
  auto alone = run(copy, {8, 200, 256}, jobs, updates, &without);
  check_same(shared, alone);
  CHECK(with.interruptions == 1);
  CHECK(without.interruptions == 1);
  // Alone, every in-flight member recomputes its whole context; shared, the 30 pool
  // tokens are recomputed once and each member recomputes only its own tokens.
  CHECK(with.reprefill_tokens + 3 * 30 <= without.reprefill_tokens);
  CHECK(with.reprefill_tokens > 0);
}

TEST_CASE("the next turn of a conversation copies the pool rows of the turn before and computes only the rest") {
  policy_model model(shared_prompt_model());
  model.init_random(24, 0.2);
  auto first = long_prompt(4, 30);
  auto second = first;
  auto more = long_prompt(5, 12);
  second.insert(second.end(), more.begin(), more.end());
  std::vector<generation_job> turn1 = {job(1, first, 5, 1), job(2, first, 5, 2)};
  std::vector<generation_job> turn2 = {job(3, second, 7, 3)};

  generation_engine engine(model, sharing(4, 64, 128));
  for (auto& j : turn1)
    engine.submit(j);
  auto a = engine.run_to_completion();
  auto prefill_before = engine.counters().prefill_tokens;
  CHECK(prefill_before == 30);
  for (auto& j : turn2)
    engine.submit(j);
  auto b = engine.run_to_completion();
  REQUIRE(b.size() == 1);
  // The 30 tokens of turn 1's entry are copied; 42 - 30 = 12 are computed.
  CHECK(engine.counters().pool_copied_tokens == 30);
  CHECK(engine.counters().prefill_tokens - prefill_before == 12);

  auto alone = run(model, {4, 200, 64}, turn2);
  std::map<uint64_t, generation_output> shared = {{3, b.front()}};
  check_same(shared, alone);
}

TEST_CASE("a pool too small for the prompt, or full of prompts in use, leaves sequences to prefill their own") {
  policy_model model(shared_prompt_model());
  model.init_random(25, 0.2);
  auto jobs = workload(40, 3);
  auto alone = run(model, {4, 200, 16}, jobs);
  engine_counters tiny{};
  auto shared = run(model, sharing(4, 16, 20), jobs, {}, &tiny);  // 40 rows do not fit in 20
  check_same(shared, alone);
  CHECK(tiny.shared_prompt_tokens == 0);

  // Two groups, room for one entry: the second group waits for nothing and prefills itself.
  std::vector<generation_job> two_groups;
  for (uint64_t m = 0; m < 3; ++m) {
    two_groups.push_back(job(m, long_prompt(6, 40), 6, 10 + m));
    two_groups.push_back(job(10 + m, long_prompt(7, 40), 6, 20 + m));
  }
  engine_counters full{};
  auto shared2 = run(model, sharing(6, 256, 50), two_groups, {}, &full);
  auto alone2 = run(model, {6, 200, 256}, two_groups);
  check_same(shared2, alone2);
  CHECK(full.shared_prompt_tokens == 3 * 40);
  CHECK(full.prefill_tokens == 40 + 3 * 40);
}

TEST_CASE("shared prompts on the ATen path (a float64 model) give what each member gets alone") {
  policy_model model(shared_prompt_model(), at::TensorOptions().dtype(at::kDouble));
  model.init_random(26, 0.2);
  auto jobs = workload(24, 4);
  engine_counters with{};
  auto shared = run(model, sharing(3, 8, 64), jobs, {}, &with);
  auto alone = run(model, {3, 200, 8}, jobs);
  check_same(shared, alone);
  CHECK(with.shared_prompt_tokens == 4 * 24);
  CHECK(with.pool_first_tokens == 4);
}
