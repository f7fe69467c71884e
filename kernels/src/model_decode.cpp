// Forward passes with the KV cache. forward_cached takes any step (prefills,
// decodes, prompt-pool fills, in any mix); decode_steady is its common case,
// every slot of a batch decoding one token, with two bodies: op by op on ATen
// (any device; a CUDA graph records it as it is) and, on a GPU, the fused
// kernels of cuda_decode.hpp (nine a layer instead of some forty). On the CPU
// in float32 the decodes' attention and cache writes are cpu_kernels.hpp's loops.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)

#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/kv_cache.hpp"
#include "areal/kernels/model.hpp"
#include "areal/kernels/precision.hpp"
#include "aten_attention.hpp"
#include "cpu_kernels.hpp"
#include "cuda_decode.hpp"
#include "decode_graphs.hpp"
#include "packed_weights.hpp"

namespace areal::kernels {

at::Tensor policy_model::attend_decode_slots(const at::Tensor& q, const at::Tensor& cache_keys,
                                             const at::Tensor& cache_values, int64_t keys,
                                             const at::Tensor& hidden_keys, double scale) {
  auto slots = q.size(0);
  auto key_rows = cache_keys.narrow(0, 0, slots).narrow(2, 0, keys);  // [slots, kv, keys, d]
  auto value_rows = cache_values.narrow(0, 0, slots).narrow(2, 0, keys);
  auto scores = at::matmul(q, key_rows.transpose(2, 3)).mul_(scale);  // [slots, kv, group, keys]
  scores.masked_fill_(hidden_keys, -std::numeric_limits<float>::infinity());
  auto probs = at::softmax(scores, -1, at::kFloat).to(value_rows.scalar_type());
  return at::matmul(probs, value_rows).view({slots, -1});  // [slots, heads * d]
}

at::Tensor policy_model::decode_steady(kv_cache& cache, const at::Tensor& tokens, const at::Tensor& positions,
                                       int64_t keys) const {
  // No host data and no host synchronization in here: a CUDA graph records it.
  auto batch = tokens.size(0), d = config_.head_dim(), kv_heads = config_.num_key_value_heads;
  auto heads = config_.num_attention_heads, group = heads / kv_heads;
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto long_opts = positions.options();
  // Row of each (slot, kv head)'s new key in a cache tensor viewed as [slots * kv_heads * rows, head_dim].
  auto slot_heads = at::arange(batch * kv_heads, long_opts);  // slot * kv_heads + head
  auto cache_rows = slot_heads * cache.rows() + positions.unsqueeze(1).expand({batch, kv_heads}).reshape({-1});
  auto angles = rotary_for(positions);
  auto x = embed_.index_select(0, tokens);

  // Products in the activations' type (no autocast to another): the fused kernels take one type.
  if (cuda_decode::applies(x, cache.keys[0], d) && (compute_ == at::kFloat || x.scalar_type() == at::kBFloat16)) {
    auto eps = config_.rms_norm_eps;
    auto cos = angles.cos.view({batch, d}), sin = angles.sin.view({batch, d});
    // x is this step's residual stream: each add_rms_norm adds a block's output to it, then normalizes.
    auto h = cuda_decode::add_rms_norm(x, at::Tensor{}, layers_[0].input_norm, eps);
    for (size_t l = 0; l < layers_.size(); ++l) {
      auto& layer = layers_[l];
      auto qkv = at::linear(h, layer.qkv_w, layer.qkv_b);
      auto q = cuda_decode::rotary_to_cache(qkv, cos, sin, cache_rows, cache.keys[l], cache.values[l], heads * d,
                                            kv_heads * d, d);
      auto attn = cuda_decode::decode_attention(q, cache.keys[l], cache.values[l], positions, heads, scale);
      h = cuda_decode::add_rms_norm(x, at::linear(attn, layer.o_w), layer.post_norm, eps);
      auto m = at::linear(cuda_decode::swiglu(at::linear(h, layer.gate_up_w)), layer.down_w);
      h = cuda_decode::add_rms_norm(x, m, l + 1 < layers_.size() ? layers_[l + 1].input_norm : final_norm_, eps);
    }
    return h;
  }

  // Key j is hidden from slot i when it lies beyond its position.
  auto hidden_keys = at::arange(keys, long_opts).unsqueeze(0).gt(positions.unsqueeze(1)).view({batch, 1, 1, keys});
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto& layer = layers_[l];
    auto& ck = cache.keys[l];
    auto& cv = cache.values[l];
    auto [q, k, v] = project_qkv(layer, rms_norm(x, layer.input_norm), angles);
    ck.view({-1, d}).index_copy_(0, cache_rows, k.reshape({-1, d}).to(ck.scalar_type()));
    cv.view({-1, d}).index_copy_(0, cache_rows, v.reshape({-1, d}).to(cv.scalar_type()));
    auto attn = attend_decode_slots(q.view({batch, kv_heads, group, d}), ck, cv, keys, hidden_keys, scale);
    x = x + at::linear(attn.to(x.scalar_type()), layer.o_w);
    x = x + mlp(layer, rms_norm(x, layer.post_norm));
  }
  return rms_norm(x, final_norm_);
}

namespace {

// Where a step's rows go (forward_cached): each new token's slot and position
// (a prompt-pool fill's tokens: their pool rows), in row order, and which
// segments are single-token decodes.
struct step_layout {
  std::vector<int64_t> slot_of, pos_of;  // per slot token; pos_of also per fill token, after them
  std::vector<int64_t> decode_rows, decode_slots, decode_lengths;  // the single-token segments
  std::vector<size_t> prefill_segments;                            // the others (input.slots' indices)
  std::vector<int64_t> segment_start, fill_start;                  // each segment's and fill's first row
  std::vector<int64_t> pool_pos;                                   // the pool row of each fill token
  int64_t slot_tokens = 0, decode_range = 0, decode_len = 0, longest = 0;
  bool any_shared = false;       // a decoding slot reads a pool prefix
  bool distinct_decodes = true;  // no slot decodes twice
  bool decodes_only() const { return prefill_segments.empty() && fill_start.empty(); }
};

step_layout lay_out(const kv_cache& cache, const step_input& input, int64_t max_positions) {
  step_layout step;
  std::vector<char> decoding(cache.length.size(), 0);
  int64_t row = 0;
  for (size_t i = 0; i < input.slots.size(); ++i) {
    auto slot = input.slots[i], count = input.counts[i], past = cache.length[static_cast<size_t>(slot)];
    if (past + count > cache.max_len() || past + count > max_positions)
      throw std::invalid_argument("slot " + std::to_string(slot) + " would exceed the cache length");
    step.longest = std::max(step.longest, past + count);
    step.segment_start.push_back(row);
    for (int64_t t = 0; t < count; ++t) {
      step.slot_of.push_back(slot);
      step.pos_of.push_back(past + t);
    }
    if (count == 1) {
      step.decode_rows.push_back(row);
      step.decode_slots.push_back(slot);
      step.decode_lengths.push_back(past + 1);
      step.distinct_decodes = step.distinct_decodes && !std::exchange(decoding[static_cast<size_t>(slot)], 1);
      step.any_shared = step.any_shared || cache.shared[static_cast<size_t>(slot)] > 0;
      step.decode_range = std::max(step.decode_range, slot + 1);
      step.decode_len = std::max(step.decode_len, past + 1);
    } else {
      step.prefill_segments.push_back(i);
    }
    row += count;
  }
  step.slot_tokens = row;
  for (auto& f : input.fills) {
    if (f.at < 0 || f.past < 0 || f.count <= 0 || f.at + f.past + f.count > cache.pool_tokens() ||
        f.past + f.count > max_positions)
      throw std::invalid_argument("a prompt-pool fill lies outside the pool");
    step.fill_start.push_back(row);
    for (int64_t t = 0; t < f.count; ++t) {
      step.pos_of.push_back(f.past + t);
      step.pool_pos.push_back(f.at + f.past + t);
    }
    row += f.count;
  }
  auto total = static_cast<int64_t>(input.tokens.size());
  if (row != total)
    throw std::invalid_argument("step_input: " + std::to_string(total) + " tokens for segments of " +
                                std::to_string(row));
  return step;
}

// The CPU loops (cpu::decode_attention) take every row of the step at once, in
// row order: its slot, its pool prefix, and where its keys end (at its own
// position: a prompt row attends causally; a pool fill's keys all lie in the
// pool). Measured on the demo's model (one step, 1 and 2 threads): 64
// re-prefills of 8 tokens 1.6x and 2.2x as fast as ATen's attention a segment
// at a time, 8 prompts of 17 1.3x and 1.6x, one of 300 1.2x and 1.4x.
struct cpu_loop_rows {
  std::vector<int64_t> slot, length, shared, shared_at;
  void add(int64_t s, int64_t len, int64_t sh, int64_t at) {
    slot.push_back(s);
    length.push_back(len);
    shared.push_back(sh);
    shared_at.push_back(at);
  }
};

cpu_loop_rows rows_for_cpu_loops(const step_layout& step, const kv_cache& cache, const step_input& input) {
  cpu_loop_rows rows;
  for (int64_t t = 0; t < step.slot_tokens; ++t) {
    auto slot = static_cast<size_t>(step.slot_of[static_cast<size_t>(t)]);
    rows.add(static_cast<int64_t>(slot), step.pos_of[static_cast<size_t>(t)] + 1, cache.shared[slot],
             cache.shared_at[slot]);
  }
  for (auto& fill : input.fills)
    for (int64_t t = 0; t < fill.count; ++t)
      rows.add(0, fill.past + t + 1, fill.past + t + 1, fill.at);
  return rows;
}

// The ATen path's plan for a step's prefill segments, pool fills and (with
// `decodes`) single-token decodes: a slot's keys are its pool prefix (source 1,
// the pool viewed as [kv_heads * pool_tokens, head_dim]) then its own rows
// (source 0, the cache viewed as [slots * kv_heads * rows, head_dim]); a fill's
// are its pool rows. The layers' caches share one shape, so one plan serves all.
detail::attention_plan plan_step_attention(const step_layout& step, const kv_cache& cache, const step_input& input,
                                           bool decodes, int64_t group, int64_t kv_heads,
                                           const at::TensorOptions& options) {
  auto rows = cache.rows(), pool = cache.pool_tokens();
  std::vector<detail::attention_sequence> sequences;
  auto slot_sequence = [&](int64_t slot, int64_t first, int64_t count) {
    auto past = cache.length[static_cast<size_t>(slot)];
    auto shared = cache.shared[static_cast<size_t>(slot)];
    detail::attention_sequence s{first, count, {}};
    if (shared > 0)
      s.keys.push_back({1, cache.shared_at[static_cast<size_t>(slot)], 1, pool, shared});
    s.keys.push_back({0, slot * kv_heads * rows + shared, 1, rows, past + count - shared});
    sequences.push_back(std::move(s));
  };
  if (decodes)
    for (size_t i = 0; i < step.decode_rows.size(); ++i)
      slot_sequence(step.decode_slots[i], step.decode_rows[i], 1);
  for (auto i : step.prefill_segments)
    slot_sequence(input.slots[i], step.segment_start[i], input.counts[i]);
  for (size_t f = 0; f < input.fills.size(); ++f) {
    auto& fill = input.fills[f];
    sequences.push_back({step.fill_start[f], fill.count, {{1, fill.at, 1, pool, fill.past + fill.count}}});
  }
  return detail::plan_attention(sequences, group, kv_heads, options.requires_grad(false));
}

}  // namespace

at::Tensor policy_model::forward_cached(kv_cache& cache, const step_input& input) const {
  at::NoGradGuard no_grad;
  compute_precision precision(compute_);
  auto total = static_cast<int64_t>(input.tokens.size());
  auto d = config_.head_dim(), kv_heads = config_.num_key_value_heads;
  auto group = config_.num_attention_heads / kv_heads;
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto device = flat_.device();
  auto long_opts = at::TensorOptions().dtype(at::kLong);

  auto step = lay_out(cache, input, config_.max_position_embeddings);
  cache.reserve(step.longest);
  // The CPU's decode-attention kernel (cpu_kernels.hpp) serves float32 caches on
  // the CPU while the CPU loops are on; the ATen path below it everything else.
  bool cpu_kernel =
      fused::enabled() &&
      (cache.keys.empty() || (cache.keys[0].scalar_type() == at::kFloat && cache.keys[0].device().is_cpu()));

  auto kernel_rows = cpu_kernel ? rows_for_cpu_loops(step, cache, input) : cpu_loop_rows{};

  // Steady state: the step is decodes only and segment i is slot i; then the
  // queries and outputs need no gathering.
  bool all_decode_in_order = step.decodes_only();
  for (size_t i = 0; all_decode_in_order && i < step.decode_slots.size(); ++i)
    all_decode_in_order = step.decode_slots[i] == static_cast<int64_t>(i);
  if (all_decode_in_order && !step.decode_rows.empty() && !step.any_shared && !cpu_kernel) {
    std::optional<at::Tensor> hidden;
    if (cache.graphs)
      hidden = cache.graphs->run(
          cache, input.tokens, step.pos_of, flat_.data_ptr(),
          [&](const at::Tensor& t, const at::Tensor& p, int64_t keys) { return decode_steady(cache, t, p, keys); });
    if (!hidden)
      hidden = decode_steady(cache, at::tensor(input.tokens, long_opts).to(device),
                             at::tensor(step.pos_of, long_opts).to(device), step.decode_len);
    for (size_t i = 0; i < input.slots.size(); ++i)
      cache.length[static_cast<size_t>(input.slots[i])] += input.counts[i];
    return *hidden;
  }

  auto tokens = at::tensor(input.tokens, long_opts).to(device);
  auto positions = at::tensor(step.pos_of, long_opts).to(device);
  // Row of each (token, kv head) in a cache tensor viewed as [slots * kv_heads * rows, head_dim],
  // and of each fill token in a pool tensor viewed as [kv_heads * pool_tokens, head_dim]: on the host
  // for the CPU loops' writes, on the device (made at the first use) for index_copy_.
  std::vector<int64_t> host_cache_rows, host_pool_rows;
  for (int64_t t = 0; t < step.slot_tokens; ++t)
    for (int64_t h = 0; h < kv_heads; ++h)
      host_cache_rows.push_back((step.slot_of[static_cast<size_t>(t)] * kv_heads + h) * cache.rows() +
                                step.pos_of[static_cast<size_t>(t)]);
  for (auto p : step.pool_pos)
    for (int64_t h = 0; h < kv_heads; ++h)
      host_pool_rows.push_back(h * cache.pool_tokens() + p);
  at::Tensor cache_rows, pool_rows;
  auto on_device = [&](at::Tensor& rows, const std::vector<int64_t>& host) -> const at::Tensor& {
    if (!rows.defined())
      rows = at::tensor(host, long_opts).to(device);
    return rows;
  };
  at::Tensor decode_row_index, decode_slot_index, decode_mask;
  bool batched_aten = !cpu_kernel && !step.decode_rows.empty() && !step.any_shared;
  // The gathers only a step that is not decodes-in-slot-order needs (not the steady state).
  if (!cpu_kernel && !step.decode_rows.empty() && !all_decode_in_order) {
    decode_row_index = at::tensor(step.decode_rows, long_opts).to(device);
    decode_slot_index = at::tensor(step.decode_slots, long_opts).to(device);
  }
  if (batched_aten) {
    // Keys beyond each decoding slot's length are masked; slots in the range that do
    // not decode this step attend to position 0 only (their rows are discarded).
    std::vector<int64_t> lens(static_cast<size_t>(step.decode_range), 1);
    for (size_t i = 0; i < step.decode_slots.size(); ++i)
      lens[static_cast<size_t>(step.decode_slots[i])] = step.decode_lengths[i];
    auto len_t = at::tensor(lens, long_opts).to(device);
    decode_mask =
        at::arange(step.decode_len, long_opts.device(device)).unsqueeze(0).ge(len_t.unsqueeze(1));  // [range, L]
    decode_mask = decode_mask.view({step.decode_range, 1, 1, step.decode_len});
  }

  auto angles = rotary_for(positions);
  auto x = embed_.index_select(0, tokens);
  // Products in float32 without autocast (which does not cast in-place operations).
  bool in_place_residual = compute_ == at::kFloat && x.scalar_type() == at::kFloat;
  // On the CPU in float32: products over weights packed once per weight version (packed_weights.hpp).
  auto packed = packed_for(x, total);
  auto eps = config_.rms_norm_eps;
  // One new token per slot (the steady state), on the CPU loops: the attention's
  // tasks rotate q and k and write the cache themselves (decode_attention_args::append).
  bool append_in_attention = cpu_kernel && packed && step.decodes_only() && step.distinct_decodes &&
                             angles.cos.is_contiguous() && angles.sin.is_contiguous();
  std::optional<detail::attention_plan> planned;  // ATen's path: made at the first layer, for all
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto& layer = layers_[l];
    auto& ck = cache.keys[l];
    auto& cv = cache.values[l];
    // Packed, qkv and gate_up have the norms' weights folded in: their products take x and its inverse RMS.
    auto qkv = packed ? packed->layers[l].qkv.product(x, layer.qkv_b, inverse_rms(x, eps)) : at::Tensor{};
    at::Tensor q, k, v;  // rotated; with append_in_attention, the attention rotates qkv's own rows
    if (!append_in_attention)
      std::tie(q, k, v) = packed ? qkv_heads(qkv, angles) : project_qkv(layer, rms_norm(x, layer.input_norm), angles);
    // Append to the cache: cache[slot, head, pos] = k[row, head], as rows of a flat view; fill tokens
    // (after the slot tokens) likewise to the prompt pool. The CPU loops copy the rows from where the
    // projection left them. (In bfloat16 compute k and v arrive in the products' type; the cache keeps the model's.)
    // (With append_in_attention k and v are not made: nothing here is appended.)
    bool rows_as_they_lie = cpu_kernel && !append_in_attention && k.scalar_type() == at::kFloat &&
                            v.scalar_type() == at::kFloat && k.stride(2) == 1 && k.stride(1) == d && v.stride(2) == 1 &&
                            v.stride(1) == d;
    auto append = [&](at::Tensor& dst, at::Tensor& rows, const std::vector<int64_t>& host_rows, const at::Tensor& src,
                      int64_t first, int64_t count) {
      if (count == 0)
        return;
      if (rows_as_they_lie)
        cpu::write_cache_rows(dst.data_ptr<float>(), host_rows.data(), count * kv_heads,
                              src.data_ptr<float>() + first * src.stride(0), src.stride(0), kv_heads, d);
      else
        dst.view({-1, d}).index_copy_(0, on_device(rows, host_rows),
                                      src.narrow(0, first, count).reshape({-1, d}).to(dst.scalar_type()));
    };
    if (!append_in_attention) {
      append(ck, cache_rows, host_cache_rows, k, 0, step.slot_tokens);
      append(cv, cache_rows, host_cache_rows, v, 0, step.slot_tokens);
    }
    if (!step.pool_pos.empty()) {
      append(cache.pool_keys[l], pool_rows, host_pool_rows, k, step.slot_tokens, total - step.slot_tokens);
      append(cache.pool_values[l], pool_rows, host_pool_rows, v, step.slot_tokens, total - step.slot_tokens);
    }
    auto attn = at::empty({total, config_.num_attention_heads * d}, x.options());
    if (cpu_kernel) {
      auto qf = qkv;
      if (!append_in_attention) {
        bool q_as_it_lies = q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == d;
        qf = q_as_it_lies ? q : q.to(at::kFloat).contiguous();
      }
      auto out = attn.scalar_type() == at::kFloat ? attn : at::empty(attn.sizes(), qf.options());
      cpu::decode_attention_args a;
      a.q = qf.data_ptr<float>();
      a.q_stride = qf.stride(0);
      if (append_in_attention) {
        a.append.qkv = qkv.data_ptr<float>();
        a.append.cos = angles.cos.data_ptr<float>();  // [total, 1, d], as rotary_for gathered them
        a.append.sin = angles.sin.data_ptr<float>();
        a.append.keys = ck.data_ptr<float>();
        a.append.values = cv.data_ptr<float>();
      }
      a.out = out.data_ptr<float>();
      a.keys = ck.data_ptr<float>();
      a.values = cv.data_ptr<float>();
      if (!cache.pool_keys.empty()) {
        a.pool_keys = cache.pool_keys[l].data_ptr<float>();
        a.pool_values = cache.pool_values[l].data_ptr<float>();
      }
      a.slot = kernel_rows.slot.data();
      a.length = kernel_rows.length.data();
      a.shared = kernel_rows.shared.data();
      a.shared_at = kernel_rows.shared_at.data();
      a.batch = total;
      a.kv_heads = kv_heads;
      a.group = group;
      a.head_dim = d;
      a.max_len = cache.rows();  // the stride of a slot's rows
      a.pool_len = cache.pool_tokens();
      a.scale = static_cast<float>(scale);
      cpu::decode_attention(a);
      if (!out.is_same(attn))
        attn.copy_(out);
    } else {
      // Off the CPU loops: ATen's attention, the decodes at once in slot rows where
      // they read no pool prefix, everything else in the buckets of one plan.
      if (batched_aten) {
        // Decodes out of slot order (beside prefills; the steady step is decode_steady):
        // queries gathered into slot rows [0, decode_range), all attended at once.
        auto qd = at::zeros({step.decode_range, config_.num_attention_heads, d}, q.options());
        qd.index_copy_(0, decode_slot_index, q.index_select(0, decode_row_index).to(qd.scalar_type()));
        auto out = attend_decode_slots(qd.view({step.decode_range, kv_heads, group, d}), ck, cv, step.decode_len,
                                       decode_mask, scale);
        attn.index_copy_(0, decode_row_index, out.index_select(0, decode_slot_index).to(attn.scalar_type()));
      }
      // The prefills, the pool fills and (beside pool prefixes) the decodes: one plan for every layer.
      if (!planned)
        planned = plan_step_attention(step, cache, input, !batched_aten, group, kv_heads, q.options());
      if (!planned->buckets.empty()) {
        std::array<at::Tensor, 2> keys{ck.view({-1, d}), {}}, values{cv.view({-1, d}), {}};
        if (!cache.pool_keys.empty()) {
          keys[1] = cache.pool_keys[l].view({-1, d});
          values[1] = cache.pool_values[l].view({-1, d});
        }
        auto out = detail::attend_planned(*planned, q, keys, values, scale);
        attn.index_copy_(0, planned->rows, out.to(attn.scalar_type()));
      }
    }
    if (packed) {
      // x is this step's own tensor: the products add into it (no sum tensor, no extra pass).
      auto& p = packed->layers[l];
      p.o.add_product(x, attn);
      p.down.add_product(x, p.gate_up.product(x, {}, inverse_rms(x, eps)));  // SwiGLU in gate_up's product
    } else if (in_place_residual) {
      x.addmm_(attn, layer.o_w.t());
      x.addmm_(mlp_activations(layer, rms_norm(x, layer.post_norm)), layer.down_w.t());
    } else {
      x = x + at::linear(attn, layer.o_w);
      x = x + mlp(layer, rms_norm(x, layer.post_norm));
    }
  }
  for (size_t i = 0; i < input.slots.size(); ++i)
    cache.length[static_cast<size_t>(input.slots[i])] += input.counts[i];
  return rms_norm(x, final_norm_);
}

}  // namespace areal::kernels
