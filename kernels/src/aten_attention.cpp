// ATen attention (aten_attention.hpp): one sequence's, and packed sequences' in buckets.
#include "aten_attention.hpp"

#include <algorithm>
#include <limits>

namespace areal::kernels::detail {

at::Tensor causal_bias(int64_t count, int64_t past, int64_t group, const at::TensorOptions& options) {
  auto long_options = options.dtype(at::kLong);
  auto query_pos = at::arange(count, long_options).add_(past);
  auto key_pos = at::arange(past + count, long_options);
  auto future = key_pos.unsqueeze(0).gt(query_pos.unsqueeze(1));  // [count, keys]
  auto bias = at::zeros(future.sizes(), options).masked_fill_(future, -std::numeric_limits<float>::infinity());
  return bias.repeat_interleave(group, 0);  // [count*group, keys]
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t past, double scale,
                  const at::Tensor& bias) {
  auto count = q.size(0), kv_heads = q.size(1), group = q.size(2), head_dim = q.size(3);
  auto qh = q.permute({1, 0, 2, 3}).reshape({kv_heads, count * group, head_dim});  // row = t * group + g
  at::Tensor scores;
  if (count > 1) {
    auto mask = bias.defined() ? bias : causal_bias(count, past, group, q.options());
    scores = at::baddbmm(mask, qh, k.transpose(1, 2), 1.0, scale);  // [kv, count*group, keys]
  } else {
    scores = at::matmul(qh, k.transpose(1, 2)).mul_(scale);
  }
  auto probs = at::softmax(scores, -1, at::kFloat).to(v.scalar_type());
  auto out = at::matmul(probs, v);  // [kv, count*group, head_dim]
  return out.view({kv_heads, count, group, head_dim})
      .permute({1, 0, 2, 3})
      .reshape({count, kv_heads * group * head_dim});
}

packed_attention_plan plan_packed_attention(const std::vector<int64_t>& lengths, const std::vector<int64_t>& parents,
                                            int64_t group, int64_t kv_heads, const at::TensorOptions& options,
                                            int64_t budget) {
  auto sequences = lengths.size();
  std::vector<int64_t> start(sequences, 0), past(sequences, 0);
  for (size_t s = 0; s < sequences; ++s) {
    if (s > 0)
      start[s] = start[s - 1] + lengths[s - 1];
    if (!parents.empty() && parents[s] >= 0)
      past[s] = lengths[static_cast<size_t>(parents[s])];
  }
  auto tokens = sequences ? start.back() + lengths.back() : 0;
  // Longest first (by the keys a sequence sees), so that a bucket's members are of similar length.
  std::vector<size_t> order;
  for (size_t s = 0; s < sequences; ++s)
    if (lengths[s] > 0)
      order.push_back(s);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return past[a] + lengths[a] > past[b] + lengths[b]; });
  packed_attention_plan plan;
  std::vector<int64_t> token_order(static_cast<size_t>(tokens), 0);
  int64_t placed = 0;  // real slots of the buckets made so far
  auto indices = [&](const std::vector<int64_t>& rows) {  // on the plan's device
    return at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(options.device());
  };
  for (size_t first = 0; first < order.size();) {
    // The bucket: the longest left, then as many as keep its scores within the budget.
    int64_t keys = past[order[first]] + lengths[order[first]], queries = lengths[order[first]];
    size_t end = first + 1;
    while (end < order.size()) {
      auto widest = std::max(queries, lengths[order[end]]);
      if (static_cast<int64_t>(end - first + 1) * widest * group * keys * kv_heads > budget)
        break;
      queries = widest;
      ++end;
    }
    packed_attention_plan::bucket b;
    b.sequences = static_cast<int64_t>(end - first);
    b.queries = queries;
    b.keys = keys;
    std::vector<int64_t> query_rows(static_cast<size_t>(b.sequences * queries), 0);
    std::vector<int64_t> key_rows(static_cast<size_t>(b.sequences * keys), 0), real_slots;
    std::vector<float> bias(static_cast<size_t>(b.sequences * queries * group * keys),
                            -std::numeric_limits<float>::infinity());
    for (int64_t m = 0; m < b.sequences; ++m) {
      auto s = order[first + static_cast<size_t>(m)];
      auto count = lengths[s], seen = past[s];
      for (int64_t j = 0; j < seen; ++j)  // the parent's keys first
        key_rows[static_cast<size_t>(m * keys + j)] = start[static_cast<size_t>(parents[s])] + j;
      for (int64_t j = 0; j < count; ++j)
        key_rows[static_cast<size_t>(m * keys + seen + j)] = start[s] + j;
      for (int64_t t = 0; t < queries; ++t) {
        bool real = t < count;
        if (real) {
          query_rows[static_cast<size_t>(m * queries + t)] = start[s] + t;
          real_slots.push_back(m * queries + t);
          token_order[static_cast<size_t>(start[s] + t)] = placed++;
        }
        // A real query sees keys 0 .. seen + t; a padding one key 0 (a row of -inf alone would give NaN).
        auto visible = real ? seen + t + 1 : 1;
        for (int64_t g = 0; g < group; ++g) {
          auto row = ((m * queries + t) * group + g) * keys;
          std::fill_n(bias.begin() + row, visible, 0.0f);
        }
      }
    }
    b.query_rows = indices(query_rows);
    b.key_rows = indices(key_rows);
    b.real_slots = indices(real_slots);
    b.bias = at::tensor(bias, at::TensorOptions().dtype(at::kFloat))
                 .view({b.sequences, queries * group, keys})
                 .to(options.device(), options.dtype().toScalarType());
    plan.buckets.push_back(std::move(b));
    first = end;
  }
  plan.token_order = indices(token_order);
  return plan;
}

at::Tensor attend_packed(const packed_attention_plan& plan, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, double scale) {
  auto kv_heads = k.size(1), head_dim = k.size(2), group = q.size(1) / kv_heads;
  auto width = kv_heads * group * head_dim;
  if (plan.buckets.empty())
    return at::zeros({0, width}, q.options());
  std::vector<at::Tensor> outs;
  for (auto& b : plan.buckets) {
    auto n = b.sequences, queries = b.queries, keys = b.keys;
    // [n * kv_heads, queries * group, head_dim], row = t * group + g, as attend's.
    auto qb = q.index_select(0, b.query_rows)
                  .view({n, queries, kv_heads, group, head_dim})
                  .permute({0, 2, 1, 3, 4})
                  .reshape({n * kv_heads, queries * group, head_dim});
    auto per_head = [&](const at::Tensor& x) {
      return x.index_select(0, b.key_rows)
          .view({n, keys, kv_heads, head_dim})
          .permute({0, 2, 1, 3})
          .reshape({n * kv_heads, keys, head_dim});
    };
    auto kb = per_head(k), vb = per_head(v);
    auto bias =
        b.bias.unsqueeze(1).expand({n, kv_heads, queries * group, keys}).reshape({n * kv_heads, queries * group, keys});
    auto scores = at::baddbmm(bias, qb, kb.transpose(1, 2), 1.0, scale);
    auto probs = at::softmax(scores, -1, at::kFloat).to(vb.scalar_type());
    auto out = at::bmm(probs, vb)
                   .view({n, kv_heads, queries, group, head_dim})
                   .permute({0, 2, 1, 3, 4})
                   .reshape({n * queries, width});
    outs.push_back(out.index_select(0, b.real_slots));
  }
  auto all = outs.size() == 1 ? outs.front() : at::cat(outs, 0);
  return all.index_select(0, plan.token_order);
}

}  // namespace areal::kernels::detail
