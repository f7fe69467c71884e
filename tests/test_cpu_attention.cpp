// The CPU's attention loops against float64 references, for every instruction
// set this CPU runs:
//   - decode attention (kernels/src/cpu_attention.cpp): head sizes on and off
//     the blocked path, group sizes around what the blocked path weighs at once,
//     lengths around the vector width, and prompt-pool prefixes;
//   - the causal attention of packed training sequences and its gradient
//     (cpu_train_attention.cpp, through fused::causal_attention): lengths
//     around the query block and the vector widths, an empty sequence, head
//     sizes on both widths, groups of 1 to 3;
//   - and beside them ATen's planned attention (aten_attention.cpp, every other
//     device's path): packed training sequences, and keys read from a KV cache
//     and a prompt pool as the engine lays them out, against a plain attention
//     of one sequence at a time.
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include "aten_attention.hpp"
#include "cpu_isa.hpp"
#include "cpu_kernels.hpp"

#include "areal/kernels/fused_layers.hpp"

using namespace areal::kernels;

namespace {

struct attention_case {
  int64_t batch, kv_heads, group, head_dim, max_len, pool_len, q_stride;
  std::vector<int64_t> slot, length, shared, shared_at;
  std::vector<float> q, keys, values, pool_keys, pool_values;
};

attention_case make_case(int64_t head_dim, int64_t group, std::vector<int64_t> lengths, std::vector<int64_t> shared,
                         uint32_t seed) {
  attention_case c;
  c.batch = static_cast<int64_t>(lengths.size());
  c.kv_heads = 2;
  c.group = group;
  c.head_dim = head_dim;
  c.max_len = 0;
  for (auto l : lengths)
    c.max_len = std::max(c.max_len, l + 3);
  c.pool_len = 160;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, int64_t n) {
    v.resize(static_cast<size_t>(n));
    for (auto& x : v)
      x = normal(rng);
  };
  auto slots = c.batch + 2;  // sequences sit in slots other than their index
  // Odd groups read their queries from rows with room between them (as in the projection's output).
  c.q_stride = c.kv_heads * group * head_dim + (group % 2 == 1 ? 3 * head_dim + 5 : 0);
  fill(c.q, c.batch * c.q_stride);
  fill(c.keys, slots * c.kv_heads * c.max_len * head_dim);
  fill(c.values, slots * c.kv_heads * c.max_len * head_dim);
  fill(c.pool_keys, c.kv_heads * c.pool_len * head_dim);
  fill(c.pool_values, c.kv_heads * c.pool_len * head_dim);
  for (int64_t b = 0; b < c.batch; ++b) {
    c.slot.push_back(slots - 1 - b);
    c.length.push_back(lengths[static_cast<size_t>(b)]);
    c.shared.push_back(shared[static_cast<size_t>(b)]);
    c.shared_at.push_back(b * 7);
  }
  return c;
}

std::vector<float> run(const attention_case& c, float scale) {
  std::vector<float> out(static_cast<size_t>(c.batch * c.kv_heads * c.group * c.head_dim), -1.0f);
  cpu::decode_attention_args a;
  a.q = c.q.data();
  a.out = out.data();
  a.keys = c.keys.data();
  a.values = c.values.data();
  a.pool_keys = c.pool_keys.data();
  a.pool_values = c.pool_values.data();
  a.slot = c.slot.data();
  a.length = c.length.data();
  a.shared = c.shared.data();
  a.shared_at = c.shared_at.data();
  a.batch = c.batch;
  a.kv_heads = c.kv_heads;
  a.group = c.group;
  a.head_dim = c.head_dim;
  a.max_len = c.max_len;
  a.pool_len = c.pool_len;
  a.scale = scale;
  a.q_stride = c.q_stride;
  cpu::decode_attention(a);
  return out;
}

// softmax(scale * q . k_j) weighted values, in double, position by position.
std::vector<double> reference(const attention_case& c, float scale) {
  auto d = c.head_dim;
  std::vector<double> out(static_cast<size_t>(c.batch * c.kv_heads * c.group * d));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      auto row = [&](const std::vector<float>& pool, const std::vector<float>& own, int64_t j) {
        if (j < c.shared[static_cast<size_t>(b)])
          return &pool[static_cast<size_t>((h * c.pool_len + c.shared_at[static_cast<size_t>(b)] + j) * d)];
        return &own[static_cast<size_t>(((c.slot[static_cast<size_t>(b)] * c.kv_heads + h) * c.max_len + j) * d)];
      };
      auto length = c.length[static_cast<size_t>(b)];
      for (int64_t g = 0; g < c.group; ++g) {
        auto base = ((b * c.kv_heads + h) * c.group + g) * d;
        auto q = &c.q[static_cast<size_t>(b * c.q_stride + (h * c.group + g) * d)];
        std::vector<double> s(static_cast<size_t>(length));
        double top = -1e300, sum = 0;
        for (int64_t j = 0; j < length; ++j) {
          const float* k = row(c.pool_keys, c.keys, j);
          double dot = 0;
          for (int64_t i = 0; i < d; ++i)
            dot += static_cast<double>(q[i]) * k[i];
          s[static_cast<size_t>(j)] = dot * scale;
          top = std::max(top, dot * scale);
        }
        for (auto& x : s)
          sum += (x = std::exp(x - top));
        for (int64_t j = 0; j < length; ++j) {
          const float* v = row(c.pool_values, c.values, j);
          for (int64_t i = 0; i < d; ++i)
            out[static_cast<size_t>(base + i)] += s[static_cast<size_t>(j)] / sum * v[i];
        }
      }
    }
  return out;
}

std::string isa_name(cpu::isa i) {
  return i == cpu::isa::avx512 ? "avx512" : i == cpu::isa::avx2 ? "avx2" : "baseline";
}

// Causal attention of packed sequences over fused rows [T, (heads + 2 kv) d],
// position by position with ATen's ops (any dtype): [T, heads * d].
at::Tensor reference_causal(const at::Tensor& qkv, const std::vector<int64_t>& cu, int64_t heads, int64_t kv,
                            int64_t d) {
  auto group = heads / kv;
  std::vector<at::Tensor> rows;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    auto length = cu[s + 1] - cu[s];
    if (length == 0)
      continue;
    auto seq = qkv.narrow(0, cu[s], length);
    auto mask = at::ones({length, length}, at::kBool).triu(1);
    std::vector<at::Tensor> per_head;
    for (int64_t h = 0; h < heads; ++h) {
      auto q = seq.narrow(1, h * d, d);
      auto k = seq.narrow(1, (heads + h / group) * d, d);
      auto v = seq.narrow(1, (heads + kv + h / group) * d, d);
      auto scores = at::matmul(q, k.t()) / std::sqrt(static_cast<double>(d));
      per_head.push_back(at::matmul(at::softmax(scores.masked_fill(mask, -INFINITY), -1), v));
    }
    rows.push_back(at::cat(per_head, 1));
  }
  return at::cat(rows, 0);
}

}  // namespace

TEST_CASE("decode attention on the CPU matches a float64 reference on every instruction set this CPU runs") {
  auto detected = cpu::detect_isa();
  auto sets = cpu::runnable_isas();
  // 8, 40 and 144 are off the blocked path (not a multiple of the width, or wider than 8 vectors);
  // 16..128 on it for AVX-512, and 8, 40 for AVX2 too.
  for (auto set : sets)
    for (int64_t head_dim : {8, 16, 40, 64, 128, 144})
      for (int64_t group : {1, 2, 3, 7}) {
        cpu::cpu_isa = set;
        auto c = make_case(head_dim, group, {1, 5, 16, 17, 33, 100, 40}, {0, 0, 9, 0, 16, 37, 40},
                           static_cast<uint32_t>(head_dim * 10 + group));
        float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        auto got = run(c, scale);
        auto want = reference(c, scale);
        cpu::cpu_isa = detected;
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i)
          worst = std::max(worst, std::abs(got[i] - want[i]));
        INFO(isa_name(set) << ", head_dim " << head_dim << ", group " << group);
        CHECK(worst < 2e-5);
      }
}

TEST_CASE("training attention on the CPU and its gradient match a float64 reference on every instruction set") {
  auto detected = cpu::detect_isa();
  // Lengths around the 4-query block and the widths of 8 and 16 lanes (keys go 2 vectors at a time), one empty.
  std::vector<int64_t> lengths = {1, 2, 3, 4, 5, 0, 7, 16, 17, 33, 70};
  std::vector<int64_t> cu = {0};
  for (auto l : lengths)
    cu.push_back(cu.back() + l);
  for (auto set : cpu::runnable_isas())
    for (int64_t head_dim : {8, 16, 24, 64, 128})
      for (int64_t group : {1, 2, 3}) {
        int64_t kv = 2, heads = kv * group;
        INFO(isa_name(set) << ", head_dim " << head_dim << ", group " << group);
        REQUIRE(fused::attention_applies(at::zeros({1}), head_dim));
        auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(head_dim * 10 + group));
        auto qkv = at::randn({cu.back(), (heads + 2 * kv) * head_dim}, gen) * 1.5;
        auto d_out = at::randn({cu.back(), heads * head_dim}, gen);
        auto exact = qkv.to(at::kDouble).requires_grad_(true);
        auto want = reference_causal(exact, cu, heads, kv, head_dim);
        (want * d_out.to(at::kDouble)).sum().backward();
        cpu::cpu_isa = set;
        auto rows = qkv.clone().requires_grad_(true);
        auto got = fused::causal_attention(rows, cu, heads, kv, head_dim);
        (got * d_out).sum().backward();
        cpu::cpu_isa = detected;
        auto worst = [](const at::Tensor& a, const at::Tensor& b) {
          return (a.to(at::kDouble) - b).abs().max().item<double>();
        };
        CHECK(worst(got.detach(), want.detach()) < 2e-5);
        CHECK(worst(rows.grad(), exact.grad()) < 1e-4);
      }
}

namespace {

// The attention of `count` queries q [count, kv, group, d] against keys and values
// [kv, keys, d], causal (query t sees keys up to keys - count + t), in q's dtype:
// the reference for the planned attention.
at::Tensor one_sequence_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  auto count = q.size(0), kv = q.size(1), group = q.size(2), d = q.size(3), keys = k.size(1);
  auto qh = q.permute({1, 0, 2, 3}).reshape({kv, count * group, d});  // row = t * group + g
  auto hidden = at::zeros({count * group, keys}, at::TensorOptions().dtype(at::kBool));
  for (int64_t t = 0; t < count; ++t)
    for (int64_t j = keys - count + t + 1; j < keys; ++j)
      hidden.narrow(0, t * group, group).select(1, j).fill_(true);
  auto scores = at::matmul(qh, k.transpose(1, 2)).mul(scale).masked_fill(hidden, -INFINITY);
  return at::matmul(at::softmax(scores, -1), v)
      .view({kv, count, group, d})
      .permute({1, 0, 2, 3})
      .reshape({count, kv * group * d});
}

}  // namespace

TEST_CASE(
    "ATen's packed attention gives each sequence what its own attention gives, with parents, in one bucket or many") {
  // A prompt and three samples that continue it, a lone sequence, an empty one, a second family.
  std::vector<int64_t> lengths = {6, 3, 1, 5, 9, 0, 4, 2};
  std::vector<int64_t> parents = {-1, 0, 0, 0, -1, -1, -1, 6};
  int64_t kv = 2, group = 3, head_dim = 8, heads = kv * group, tokens = 30;
  double scale = 1.0 / std::sqrt(double(head_dim));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto options = at::TensorOptions().dtype(at::kDouble);
  auto q = at::randn({tokens, heads, head_dim}, gen, options), k = at::randn({tokens, kv, head_dim}, gen, options),
       v = at::randn({tokens, kv, head_dim}, gen, options), d_out = at::randn({tokens, heads * head_dim}, gen, options);
  // One sequence at a time: its parent's keys and values first.
  auto one_at_a_time = [&](const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
    auto qs = query.split_with_sizes(lengths, 0), ks = key.split_with_sizes(lengths, 0),
         vs = value.split_with_sizes(lengths, 0);
    std::vector<at::Tensor> outs;
    for (size_t s = 0; s < lengths.size(); ++s) {
      if (lengths[s] == 0)
        continue;
      auto keys = ks[s], values = vs[s];
      if (parents[s] >= 0) {
        auto p = static_cast<size_t>(parents[s]);
        keys = at::cat({ks[p], keys}, 0);
        values = at::cat({vs[p], values}, 0);
      }
      outs.push_back(one_sequence_attention(qs[s].view({lengths[s], kv, group, head_dim}), keys.permute({1, 0, 2}),
                                            values.permute({1, 0, 2}), scale));
    }
    return at::cat(outs, 0);
  };
  auto run = [&](const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& attention) {
    auto qg = q.clone().requires_grad_(true), kg = k.clone().requires_grad_(true), vg = v.clone().requires_grad_(true);
    auto out = attention(qg, kg, vg);
    (out * d_out).sum().backward();
    return std::vector<at::Tensor>{out.detach(), qg.grad(), kg.grad(), vg.grad()};
  };
  auto want = run(one_at_a_time);
  // A budget of a whole batch's scores: one bucket; of one element: a bucket per sequence.
  for (int64_t budget : {int64_t{1} << 24, int64_t{1}}) {
    INFO("budget " << budget);
    auto plan = areal::kernels::detail::plan_packed_attention(lengths, parents, group, kv, options, budget);
    CHECK(plan.plan.buckets.size() == (budget == 1 ? 7u : 1u));
    auto got = run([&](const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
      return areal::kernels::detail::attend_packed(plan, query, key, value, scale);
    });
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("output, then the gradients of q, k and v: " << i);
      REQUIRE(got[i].sizes() == want[i].sizes());
      // The planned attention takes the softmax in float32; the reference in float64.
      CHECK((got[i] - want[i]).abs().max().item<double>() < 2e-6);
    }
  }
}

TEST_CASE("ATen's planned attention reads a KV cache and a prompt pool as the engine lays them out") {
  namespace d = areal::kernels::detail;
  int64_t slots = 3, kv = 2, group = 2, rows = 10, pool_tokens = 12, head_dim = 4, queries = 13;
  double scale = 0.4;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  auto options = at::TensorOptions().dtype(at::kDouble);
  auto cache_k = at::randn({slots, kv, rows, head_dim}, gen, options),
       cache_v = at::randn({slots, kv, rows, head_dim}, gen, options);
  auto pool_k = at::randn({kv, pool_tokens, head_dim}, gen, options),
       pool_v = at::randn({kv, pool_tokens, head_dim}, gen, options);
  auto q = at::randn({queries, kv * group, head_dim}, gen, options);
  // Slot s's own rows from `from`, and pool rows from `at`, as spans of the views below.
  auto own = [&](int64_t slot, int64_t from, int64_t length) {
    return d::key_span{0, slot * kv * rows + from, 1, rows, length};
  };
  auto pooled = [&](int64_t at, int64_t length) { return d::key_span{1, at, 1, pool_tokens, length}; };
  std::vector<d::attention_sequence> sequences = {
      {0, 2, {pooled(2, 5), own(0, 5, 4)}},  // two new tokens after a pool prefix of 5 (keys 5+4)
      {2, 7, {own(2, 0, 7)}},                // a prefill of 7
      {9, 3, {pooled(0, 6)}},                // a pool fill of 3 after 3 rows already there
      {12, 1, {own(1, 0, 4)}},               // a decode at position 3
      {13, 0, {own(1, 0, 2)}},               // no queries: left out
  };
  // The reference: each sequence's keys cut from the tensors, attended alone.
  std::vector<at::Tensor> want;
  for (auto& s : sequences) {
    if (s.queries == 0)
      continue;
    std::vector<at::Tensor> ks, vs;
    for (auto& span : s.keys) {
      bool from_pool = span.source == 1;
      auto slot = span.base / (kv * rows), first = from_pool ? span.base : span.base % (kv * rows);
      ks.push_back(from_pool ? pool_k.narrow(1, first, span.length) : cache_k[slot].narrow(1, first, span.length));
      vs.push_back(from_pool ? pool_v.narrow(1, first, span.length) : cache_v[slot].narrow(1, first, span.length));
    }
    want.push_back(one_sequence_attention(q.narrow(0, s.first_query, s.queries).view({s.queries, kv, group, head_dim}),
                                          at::cat(ks, 1), at::cat(vs, 1), scale));
  }
  for (int64_t budget : {int64_t{1} << 24, int64_t{1}}) {
    INFO("budget " << budget);
    auto plan = d::plan_attention(sequences, group, kv, options, budget);
    CHECK(plan.buckets.size() == (budget == 1 ? 4u : 1u));
    auto got = d::attend_planned(plan, q, {cache_k.view({-1, head_dim}), pool_k.view({-1, head_dim})},
                                 {cache_v.view({-1, head_dim}), pool_v.view({-1, head_dim})}, scale);
    // Row i of the output is q row plan.rows[i]'s: put them back in q's order.
    REQUIRE(plan.rows.size(0) == queries);
    auto in_order = at::empty_like(got).index_copy_(0, plan.rows, got);
    auto expected = at::cat(want, 0);
    REQUIRE(in_order.sizes() == expected.sizes());
    CHECK((in_order - expected).abs().max().item<double>() < 2e-6);
  }
}

TEST_CASE("the attention plan's buckets hold 16 M score elements on the CPU and 256 M on other devices") {
  // 16 sequences of 1,024 tokens at Qwen2-0.5B's heads (group 7, 2 kv heads): 14.7 M scores each.
  std::vector<int64_t> lengths(16, 1024);
  auto on = [&](at::Device device) {
    return areal::kernels::detail::plan_packed_attention(lengths, {}, 7, 2, at::TensorOptions().device(device))
        .plan.buckets.size();
  };
  CHECK(on(at::kCPU) == 16u);
  // The meta device (shapes without data) stands in for a GPU: the plan's tensors are made there.
  CHECK(on(at::kMeta) == 1u);
}
