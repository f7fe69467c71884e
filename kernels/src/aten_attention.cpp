// ATen attention in planned buckets (aten_attention.hpp).
#include "aten_attention.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "torch_compat.hpp"

namespace areal::kernels::detail {

namespace {

int64_t key_count(const attention_sequence& s) {
  int64_t n = 0;
  for (auto& span : s.keys)
    n += span.length;
  return n;
}

at::Tensor on_device(const std::vector<int64_t>& rows, const at::TensorOptions& options) {
  return at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(options.device());
}

// softmax(q k^T * scale + bias) v: q [n, h, L, d], k and v [n, h, S, d], bias [n, 1, L, S].
// On a GPU, ATen's fused kernel where the LibTorch has it; elsewhere the score
// product with the scale and the mask in it (baddbmm: one BLAS call, no pass over
// the scores before the softmax), the softmax in float32.
at::Tensor scaled_dot_product(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                              double scale) {
  if (compat::has_sdpa && q.is_cuda()) {
    auto type = q.scalar_type();
    return compat::sdpa(q, k.to(type), v.to(type), bias.to(type), scale);
  }
  auto n = q.size(0), h = q.size(1), L = q.size(2), S = k.size(2), d = q.size(3);
  auto scores = at::baddbmm(bias.expand({n, h, L, S}).reshape({n * h, L, S}), q.reshape({n * h, L, d}),
                            k.reshape({n * h, S, d}).transpose(1, 2), 1.0, scale);
  auto probs = at::softmax(scores, -1, at::kFloat).to(v.scalar_type());
  return at::bmm(probs, v.reshape({n * h, S, d})).view({n, h, L, v.size(3)});
}

}  // namespace

attention_plan plan_attention(const std::vector<attention_sequence>& sequences, int64_t group, int64_t kv_heads,
                              const at::TensorOptions& options, int64_t budget) {
  std::vector<int64_t> keys_of;
  std::vector<size_t> order;  // the sequences with queries, longest first (by the keys they see)
  for (size_t s = 0; s < sequences.size(); ++s) {
    keys_of.push_back(key_count(sequences[s]));
    if (sequences[s].queries > keys_of.back())
      throw std::logic_error("plan_attention: a sequence has more queries than keys");
    if (sequences[s].queries > 0)
      order.push_back(s);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys_of[a] > keys_of[b]; });
  if (budget <= 0)
    budget = options.device().is_cpu() ? int64_t{1} << 24 : int64_t{1} << 28;
  attention_plan plan;
  plan.kv_heads = kv_heads;
  std::vector<int64_t> rows;
  for (size_t first = 0; first < order.size();) {
    // The bucket: the longest left, then as many as keep its scores within the budget.
    int64_t keys = keys_of[order[first]], queries = sequences[order[first]].queries;
    size_t end = first + 1;
    while (end < order.size()) {
      auto widest = std::max(queries, sequences[order[end]].queries);
      if (static_cast<int64_t>(end - first + 1) * widest * group * keys * kv_heads > budget)
        break;
      queries = widest;
      ++end;
    }
    attention_plan::bucket b;
    auto n = static_cast<int64_t>(end - first);
    b.sequences = n;
    b.queries = queries;
    b.keys = keys;
    std::vector<int64_t> query_rows(static_cast<size_t>(n * queries), 0), real_slots;
    std::array<std::vector<int64_t>, 2> key_rows;
    for (auto& r : key_rows)
      r.assign(static_cast<size_t>(n * kv_heads * keys), 0);
    std::vector<int64_t> from_second(static_cast<size_t>(n * kv_heads * keys), 0);
    std::array<bool, 2> used{false, false};
    std::vector<int64_t> last_key(static_cast<size_t>(n * queries), 0);  // the last key each query slot sees
    for (int64_t m = 0; m < n; ++m) {
      auto& s = sequences[order[first + static_cast<size_t>(m)]];
      int64_t j = 0;  // the sequence's key
      for (auto& span : s.keys) {
        if ((span.source != 0 && span.source != 1) || span.length < 0)
          throw std::logic_error("plan_attention: a key span has source 0 or 1 and no negative length");
        used[static_cast<size_t>(span.source)] = used[static_cast<size_t>(span.source)] || span.length > 0;
        for (int64_t i = 0; i < span.length; ++i, ++j)
          for (int64_t h = 0; h < kv_heads; ++h) {
            auto slot = static_cast<size_t>((m * kv_heads + h) * keys + j);
            key_rows[static_cast<size_t>(span.source)][slot] = span.base + i * span.step + h * span.head_stride;
            from_second[slot] = span.source == 1;
          }
      }
      auto seen = j - s.queries;  // keys before the first query
      for (int64_t t = 0; t < queries; ++t) {
        bool real = t < s.queries;
        if (real) {
          query_rows[static_cast<size_t>(m * queries + t)] = s.first_query + t;
          real_slots.push_back(m * queries + t);
          rows.push_back(s.first_query + t);
        }
        // A real query sees keys 0 .. seen + t; a padding one key 0.
        last_key[static_cast<size_t>(m * queries + t)] = real ? seen + t : 0;
      }
    }
    b.query_rows = on_device(query_rows, options);
    for (size_t src = 0; src < 2; ++src)
      if (used[src])
        b.key_rows[src] = on_device(key_rows[src], options);
    if (used[0] && used[1])
      b.from_second = on_device(from_second, options).ne(0).view({n, kv_heads, keys, 1});
    b.real_slots = on_device(real_slots, options);
    // The mask made on the device from each slot's last key: made on the host it was
    // n * queries * group * keys floats (0.75-2.3 s and 0.9 GB for 32 sequences of 1,024
    // tokens at Qwen2-0.5B's heads), then copied over.
    auto hidden = at::arange(keys, at::TensorOptions().dtype(at::kLong).device(options.device()))
                      .view({1, 1, 1, keys})
                      .gt(on_device(last_key, options).view({n, queries, 1, 1}));
    b.bias = at::zeros({n, queries, 1, keys}, options)
                 .masked_fill_(hidden, -std::numeric_limits<float>::infinity())
                 .expand({n, queries, group, keys})
                 .reshape({n, 1, queries * group, keys});
    plan.buckets.push_back(std::move(b));
    first = end;
  }
  plan.rows = on_device(rows, options);
  return plan;
}

at::Tensor attend_planned(const attention_plan& plan, const at::Tensor& q, const std::array<at::Tensor, 2>& keys,
                          const std::array<at::Tensor, 2>& values, double scale) {
  auto head_dim = q.size(2);
  if (plan.buckets.empty())
    return at::zeros({0, q.size(1) * head_dim}, q.options());
  std::vector<at::Tensor> outs;
  for (auto& b : plan.buckets) {
    auto n = b.sequences, queries = b.queries, kv_heads = plan.kv_heads, group = q.size(1) / kv_heads;
    // [n, kv_heads, queries * group, head_dim], row = t * group + g: the kv head's queries share its keys.
    auto qb = q.index_select(0, b.query_rows)
                  .view({n, queries, kv_heads, group, head_dim})
                  .permute({0, 2, 1, 3, 4})
                  .reshape({n, kv_heads, queries * group, head_dim});
    auto gather = [&](const std::array<at::Tensor, 2>& source) {  // [n, kv_heads, keys, head_dim]
      at::Tensor rows[2];
      for (size_t s = 0; s < 2; ++s)
        if (b.key_rows[s].defined())
          rows[s] = source[s].index_select(0, b.key_rows[s]).view({n, kv_heads, b.keys, head_dim});
      if (!rows[0].defined())
        return rows[1];
      if (!rows[1].defined())
        return rows[0];
      return at::where(b.from_second, rows[1], rows[0].to(rows[1].scalar_type()));
    };
    auto out = scaled_dot_product(qb, gather(keys), gather(values), b.bias, scale)
                   .view({n, kv_heads, queries, group, head_dim})
                   .permute({0, 2, 1, 3, 4})
                   .reshape({n * queries, kv_heads * group * head_dim});
    outs.push_back(out.index_select(0, b.real_slots));
  }
  return outs.size() == 1 ? outs.front() : at::cat(outs, 0);
}

packed_attention_plan plan_packed_attention(const std::vector<int64_t>& lengths, const std::vector<int64_t>& parents,
                                            int64_t group, int64_t kv_heads, const at::TensorOptions& options,
                                            int64_t budget) {
  // Packed keys [T, kv_heads, head_dim] viewed as [T * kv_heads, head_dim]: token t, head h is row t * kv_heads + h.
  std::vector<int64_t> start(lengths.size(), 0);
  for (size_t s = 1; s < lengths.size(); ++s)
    start[s] = start[s - 1] + lengths[s - 1];
  std::vector<attention_sequence> sequences(lengths.size());
  for (size_t s = 0; s < lengths.size(); ++s) {
    auto& seq = sequences[s];
    seq.first_query = start[s];
    seq.queries = lengths[s];
    if (!parents.empty() && parents[s] >= 0) {  // the parent's keys first
      auto p = static_cast<size_t>(parents[s]);
      seq.keys.push_back({0, start[p] * kv_heads, kv_heads, 1, lengths[p]});
    }
    seq.keys.push_back({0, start[s] * kv_heads, kv_heads, 1, lengths[s]});
  }
  packed_attention_plan packed;
  packed.plan = plan_attention(sequences, group, kv_heads, options, budget);
  // Every token is a query once, so the output rows are a permutation of the tokens: its inverse.
  auto tokens = packed.plan.rows.size(0);
  packed.token_order = at::empty({tokens}, packed.plan.rows.options())
                           .index_copy_(0, packed.plan.rows, at::arange(tokens, packed.plan.rows.options()));
  return packed;
}

at::Tensor attend_packed(const packed_attention_plan& packed, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, double scale) {
  auto head_dim = k.size(2);
  auto out = attend_planned(packed.plan, q, {k.reshape({-1, head_dim}), at::Tensor{}},
                            {v.reshape({-1, head_dim}), at::Tensor{}}, scale);
  return out.index_select(0, packed.token_order);
}

}  // namespace areal::kernels::detail
