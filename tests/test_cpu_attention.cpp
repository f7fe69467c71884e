// The CPU decode-attention loop (kernels/src/cpu_attention.cpp) against a
// float64 reference, for every instruction set this CPU runs: head sizes on
// and off the blocked path, group sizes around what the blocked path weighs at
// once, lengths around the vector width, and prompt-pool prefixes.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "cpu_isa.hpp"
#include "cpu_kernels.hpp"

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

}  // namespace

TEST_CASE("decode attention on the CPU matches a float64 reference on every instruction set this CPU runs") {
  auto detected = cpu::detect_isa();
  std::vector<cpu::isa> sets = {cpu::isa::baseline};
  if (detected != cpu::isa::baseline)
    sets.push_back(cpu::isa::avx2);
  if (detected == cpu::isa::avx512)
    sets.push_back(cpu::isa::avx512);
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
