#include "areal/kernels/model.hpp"
#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/precision.hpp"
#include "areal/runtime/files.hpp"
#include "cpu_kernels.hpp"
#include "decode_graphs.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

namespace areal::kernels {

namespace {

at::ScalarType to_scalar_type(dtype t, const std::string& where) {
  switch (t) {
    case dtype::f32:
      return at::kFloat;
    case dtype::bf16:
      return at::kBFloat16;
    case dtype::f16:
      return at::kHalf;
    default:
      throw format_error(where + ": dtype " + std::string{to_string(t)} + " cannot hold model weights");
  }
}

dtype to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return dtype::bf16;
    case at::kHalf:
      return dtype::f16;
    default:
      return dtype::f32;
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The causal mask of `count` new query tokens against `past + count` keys as an
// additive bias: 0 where query t (at position past + t) may see the key, -inf
// where the key lies in its future. One row per (query, head of the group):
// row = t * group + g.
at::Tensor causal_bias(int64_t count, int64_t past, int64_t group, const at::TensorOptions& options) {
  auto long_options = options.dtype(at::kLong);
  auto query_pos = at::arange(count, long_options).add_(past);
  auto key_pos = at::arange(past + count, long_options);
  auto future = key_pos.unsqueeze(0).gt(query_pos.unsqueeze(1));  // [count, keys]
  auto bias = at::zeros(future.sizes(), options).masked_fill_(future, -std::numeric_limits<float>::infinity());
  return bias.repeat_interleave(group, 0);  // [count*group, keys]
}

// Scaled dot-product attention of `count` new query tokens against `past + count`
// keys, causal: query t sees keys 0 .. past + t. The scale and the mask go into
// the score product itself (baddbmm: bias + scale * q k^T, one BLAS call), so no
// pass over the scores precedes the softmax; `bias` is causal_bias(count, past,
// group), which a caller attending many times at one shape computes once.
//   q [count, kv_heads, group, head_dim]; k, v [kv_heads, past + count, head_dim]
//   returns [count, kv_heads * group * head_dim]
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t past, double scale,
                  const at::Tensor& bias = {}) {
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

}  // namespace

// -- parameters -----------------------------------------------------------------

policy_model::policy_model(model_config config, at::TensorOptions options) : config_(std::move(config)) {
  config_.validate("model configuration");
  compute_ = parse_compute_dtype(config_.compute_dtype);
  auto h = config_.hidden_size, d = config_.head_dim();
  auto q = config_.num_attention_heads * d, kv = config_.num_key_value_heads * d, inter = config_.intermediate_size;
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto s : shape)
      n *= s;
    layout_.push_back({std::move(name), std::move(shape), offset, n});
    offset += n;
  };
  add("model.embed_tokens.weight", {config_.vocab_size, h});
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    auto p = "model.layers." + std::to_string(l) + ".";
    // q, k, v weights adjacent (and their biases adjacent), gate and up adjacent:
    // each group is also one fused matrix, so a layer runs 4 products instead of 7.
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {q, h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.weight", {kv, h});
    if (config_.attention_bias) {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    add(p + "self_attn.o_proj.weight", {h, q});
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "mlp.gate_proj.weight", {inter, h});
    add(p + "mlp.up_proj.weight", {inter, h});
    add(p + "mlp.down_proj.weight", {h, inter});
  }
  add("model.norm.weight", {h});
  if (!config_.tie_word_embeddings)
    add("lm_head.weight", {config_.vocab_size, h});
  flat_ = at::zeros({offset}, options);
  bind_views();

  // Rotary tables, Hugging Face convention: inv_freq_i = theta^(-2i/d), angles duplicated over both halves.
  auto fopts = at::TensorOptions().dtype(at::kFloat).device(options.device());
  auto inv_freq = at::pow(config_.rope_theta, at::arange(0, d, 2, fopts).div(static_cast<double>(d))).reciprocal();
  auto positions = at::arange(config_.max_position_embeddings, fopts);
  auto angles = at::outer(positions, inv_freq);
  auto emb = at::cat({angles, angles}, -1);
  rope_cos_ = emb.cos();
  rope_sin_ = emb.sin();
}

int64_t policy_model::offset_of(const std::string& name) const {
  for (auto& e : layout_)
    if (e.name == name)
      return e.offset;
  throw format_error("no parameter named \"" + name + "\" in this model");
}

void policy_model::bind_views() {
  // The forward pass uses one tensor per block of parameters that run together
  // (q/k/v weights, q/k/v biases, gate/up). When trainable, each block is a leaf
  // that shares flat_'s storage and whose gradient is a view into flat_grad_:
  // autograd accumulates in place, so gradients land in one buffer without the
  // full-size temporaries that views of a single leaf would cost in backward.
  auto block = [&](const std::string& first, std::vector<int64_t> shape) {
    int64_t numel = 1;
    for (auto d : shape)
      numel *= d;
    auto offset = offset_of(first);
    auto view = flat_.narrow(0, offset, numel).view(shape);
    if (!flat_grad_.defined())
      return view;
    auto leaf = view.detach().requires_grad_(true);
    leaf.mutable_grad() = flat_grad_.narrow(0, offset, numel).view(shape);
    return leaf;
  };
  auto h = config_.hidden_size, d = config_.head_dim(), inter = config_.intermediate_size;
  auto qkv_rows = (config_.num_attention_heads + 2 * config_.num_key_value_heads) * d;
  embed_ = block("model.embed_tokens.weight", {config_.vocab_size, h});
  final_norm_ = block("model.norm.weight", {h});
  lm_head_ = config_.tie_word_embeddings ? embed_ : block("lm_head.weight", {config_.vocab_size, h});
  layers_.clear();
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    auto p = "model.layers." + std::to_string(l) + ".";
    layer_views v;
    v.input_norm = block(p + "input_layernorm.weight", {h});
    v.qkv_w = block(p + "self_attn.q_proj.weight", {qkv_rows, h});
    if (config_.attention_bias)
      v.qkv_b = block(p + "self_attn.q_proj.bias", {qkv_rows});
    v.o_w = block(p + "self_attn.o_proj.weight", {h, config_.num_attention_heads * d});
    v.post_norm = block(p + "post_attention_layernorm.weight", {h});
    v.gate_up_w = block(p + "mlp.gate_proj.weight", {2 * inter, h});
    v.down_w = block(p + "mlp.down_proj.weight", {h, inter});
    layers_.push_back(v);
  }
}

void policy_model::set_trainable(bool trainable) {
  if (trainable && !flat_grad_.defined())
    flat_grad_ = at::zeros_like(flat_);
  if (!trainable)
    flat_grad_ = at::Tensor();
  bind_views();
}

at::Tensor policy_model::parameter(const std::string& name) const {
  for (auto& e : layout_)
    if (e.name == name)
      return flat_.narrow(0, e.offset, e.numel).view(e.shape);
  throw format_error("no parameter named \"" + name + "\" in this model");
}

void policy_model::init_random(uint64_t seed, double std) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  auto cpu = at::empty({flat_.numel()}, at::kFloat);
  for (auto& e : layout_) {
    auto view = cpu.narrow(0, e.offset, e.numel);
    if (e.name.find("norm.weight") != std::string::npos)
      view.fill_(1.0);
    else  // matrices, and biases too: non-zero biases keep them visible to tests
      view.normal_(0.0, std, gen);
  }
  flat_.copy_(cpu);
}

void policy_model::load_tensors(const tensor_map& tensors, const std::string& source) {
  at::NoGradGuard no_grad;
  for (auto& e : layout_) {
    auto it = tensors.find(e.name);
    if (it == tensors.end())
      throw format_error(source + ": tensor \"" + e.name + "\" is missing (the config describes a model with it)");
    auto& t = it->second;
    if (t.shape != e.shape)
      throw format_error(source + ": tensor \"" + e.name + "\" has shape " + shape_text(t.shape) +
                         ", the config needs " + shape_text(e.shape));
    auto type = to_scalar_type(t.type, source + ": tensor \"" + e.name + "\"");
    auto blob = at::from_blob(const_cast<char*>(t.data.data()), {e.numel}, at::TensorOptions().dtype(type));
    auto target = flat_.narrow(0, e.offset, e.numel);
    target.copy_(blob);
    if (!at::isfinite(target).all().item<bool>())
      throw format_error(source + ": tensor \"" + e.name + "\" holds NaN or infinite values; the weights are damaged");
  }
  for (auto& [name, t] : tensors) {
    bool known = std::any_of(layout_.begin(), layout_.end(), [&](auto& e) { return e.name == name; });
    bool harmless = (name == "lm_head.weight" && config_.tie_word_embeddings) ||
                    name.find("rotary_emb.inv_freq") != std::string::npos;
    if (!known && !harmless)
      throw format_error(source + ": unexpected tensor \"" + name +
                         "\": the config does not describe it (wrong config.json?)");
  }
}

tensor_map policy_model::to_tensors() const {
  tensor_map out;
  auto cpu = flat_.detach().to(at::kCPU).contiguous();
  auto element = cpu.element_size();
  for (auto& e : layout_) {
    stored_tensor t;
    t.type = to_dtype(cpu.scalar_type());
    t.shape = e.shape;
    auto begin = static_cast<const char*>(cpu.data_ptr()) + e.offset * element;
    t.data.assign(begin, begin + e.numel * element);
    out.emplace(e.name, std::move(t));
  }
  return out;
}

void policy_model::save(const std::string& directory, uint64_t max_shard_bytes) const {
  std::filesystem::create_directories(directory);
  write_checkpoint(directory, to_tensors(), max_shard_bytes);
  try {
    write_file_atomically(std::filesystem::path{directory} / "config.json", to_config_json(config_));
  } catch (const file_error& e) {
    throw format_error(e.what());
  }
}

policy_model policy_model::load(const std::string& directory, at::TensorOptions options) {
  auto config = load_model_config((std::filesystem::path{directory} / "config.json").string());
  policy_model model(config, options);
  model.load_tensors(read_checkpoint(directory), directory);
  return model;
}

// -- forward --------------------------------------------------------------------

at::Tensor policy_model::rms_norm(const at::Tensor& x, const at::Tensor& weight) const {
  if (fused::applies(x) && fused::applies(weight))
    return fused::rms_norm(x, weight, config_.rms_norm_eps);
  auto xf = x.to(at::kFloat);
  auto normed = xf * at::rsqrt(xf.pow(2).mean(-1, true).add_(config_.rms_norm_eps));
  return normed.to(x.scalar_type()) * weight;
}

policy_model::rotary policy_model::rotary_for(const at::Tensor& positions) const {
  // Gathered once per forward: every layer rotates by the same angles.
  return {rope_cos_.index_select(0, positions).unsqueeze(1).to(flat_.scalar_type()),
          rope_sin_.index_select(0, positions).unsqueeze(1).to(flat_.scalar_type())};
}

// x [T, heads, head_dim] rotated: x * cos + rotate_half(x) * sin.
at::Tensor policy_model::rotate(const at::Tensor& x, const rotary& angles) const {
  auto half = x.size(-1) / 2;
  auto rotated = at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
  return x * angles.cos + rotated * angles.sin;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> policy_model::project_qkv(const layer_views& layer, const at::Tensor& h,
                                                                         const rotary& angles) const {
  auto total = h.size(0), d = config_.head_dim();
  auto q_width = config_.num_attention_heads * d, kv_width = config_.num_key_value_heads * d;
  auto qkv = at::linear(h, layer.qkv_w, layer.qkv_b);  // [T, q + 2 kv]
  if (fused::applies(qkv) && fused::applies(angles.cos)) {
    // q and k rotated, v copied, in one pass each way.
    auto parts = fused::rotary(qkv, angles.cos.view({total, d}), angles.sin.view({total, d}), q_width + kv_width, d)
                     .split_with_sizes({q_width, kv_width, kv_width}, 1);
    return {parts[0].reshape({total, config_.num_attention_heads, d}),
            parts[1].reshape({total, config_.num_key_value_heads, d}),
            parts[2].reshape({total, config_.num_key_value_heads, d})};
  }
  // split, not narrow: a split's backward is one concatenation, a narrow's a zeroed full-size gradient each.
  auto parts = qkv.split_with_sizes({q_width, kv_width, kv_width}, 1);
  auto q = rotate(parts[0].reshape({total, config_.num_attention_heads, d}), angles);
  auto k = rotate(parts[1].reshape({total, config_.num_key_value_heads, d}), angles);
  auto v = parts[2].reshape({total, config_.num_key_value_heads, d});
  return {q, k, v};
}

at::Tensor policy_model::mlp_activations(const layer_views& layer, const at::Tensor& m) const {
  auto gate_up = at::linear(m, layer.gate_up_w);  // [T, 2 I]: gate then up
  if (fused::applies(gate_up))
    return fused::swiglu(gate_up);
  auto halves = gate_up.chunk(2, 1);
  return at::silu(halves[0]) * halves[1];
}

at::Tensor policy_model::mlp(const layer_views& layer, const at::Tensor& m) const {
  return at::linear(mlp_activations(layer, m), layer.down_w);
}

at::Tensor policy_model::forward(const at::Tensor& tokens, const std::vector<int64_t>& cu_seqlens) const {
  auto total = tokens.size(0);
  if (cu_seqlens.size() < 2 || cu_seqlens.front() != 0 || cu_seqlens.back() != total)
    throw std::invalid_argument("cu_seqlens must run from 0 to the number of tokens");
  compute_precision precision(compute_);
  auto d = config_.head_dim(), kv_heads = config_.num_key_value_heads;
  auto group = config_.num_attention_heads / kv_heads;
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<int64_t> pos;
  pos.reserve(static_cast<size_t>(total));
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s)
    for (int64_t p = 0; p < cu_seqlens[s + 1] - cu_seqlens[s]; ++p)
      pos.push_back(p);
  if (!pos.empty() && *std::max_element(pos.begin(), pos.end()) >= config_.max_position_embeddings)
    throw std::invalid_argument("a sequence is longer than max_position_embeddings");
  auto positions = at::tensor(pos, at::TensorOptions().dtype(at::kLong)).to(flat_.device());
  auto angles = rotary_for(positions);
  auto x = embed_.index_select(0, tokens.to(flat_.device()));
  std::vector<int64_t> lengths;
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s)
    lengths.push_back(cu_seqlens[s + 1] - cu_seqlens[s]);
  std::map<int64_t, at::Tensor> bias_of_length;  // every layer masks the same lengths
  for (auto count : lengths)
    if (count > 1 && !bias_of_length.count(count))
      bias_of_length[count] = causal_bias(count, 0, group, x.options().requires_grad(false));
  for (auto& layer : layers_) {
    auto [q, k, v] = project_qkv(layer, rms_norm(x, layer.input_norm), angles);
    // Per sequence by split, not narrow (see project_qkv).
    auto qs = q.split_with_sizes(lengths, 0), ks = k.split_with_sizes(lengths, 0), vs = v.split_with_sizes(lengths, 0);
    std::vector<at::Tensor> outs;
    for (size_t s = 0; s < lengths.size(); ++s) {
      auto count = lengths[s];
      if (count == 0)
        continue;
      auto bias = count > 1 ? bias_of_length[count] : at::Tensor{};
      outs.push_back(attend(qs[s].view({count, kv_heads, group, d}), ks[s].permute({1, 0, 2}), vs[s].permute({1, 0, 2}),
                            0, scale, bias));
    }
    x = x + at::linear(at::cat(outs, 0), layer.o_w);
    x = x + mlp(layer, rms_norm(x, layer.post_norm));
  }
  return rms_norm(x, final_norm_);
}

at::Tensor policy_model::forward_cached(kv_cache& cache, const step_input& input) const {
  at::NoGradGuard no_grad;
  compute_precision precision(compute_);
  auto total = static_cast<int64_t>(input.tokens.size());
  auto d = config_.head_dim(), kv_heads = config_.num_key_value_heads;
  auto group = config_.num_attention_heads / kv_heads;
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto device = flat_.device();
  auto long_opts = at::TensorOptions().dtype(at::kLong);

  // Where each new token goes: a slot and position, or pool rows; which segments are single-token decodes.
  std::vector<int64_t> slot_of, pos_of, decode_rows, decode_slots, decode_lengths, decode_shared, decode_shared_at;
  std::vector<size_t> prefill_segments;
  std::vector<int64_t> segment_start, fill_start;
  int64_t row = 0, decode_range = 0, decode_len = 0;
  for (size_t i = 0; i < input.slots.size(); ++i) {
    auto slot = input.slots[i], count = input.counts[i], past = cache.length[static_cast<size_t>(slot)];
    if (past + count > cache.max_len() || past + count > config_.max_position_embeddings)
      throw std::invalid_argument("slot " + std::to_string(slot) + " would exceed the cache length");
    segment_start.push_back(row);
    for (int64_t t = 0; t < count; ++t) {
      slot_of.push_back(slot);
      pos_of.push_back(past + t);
    }
    if (count == 1) {
      decode_rows.push_back(row);
      decode_slots.push_back(slot);
      decode_lengths.push_back(past + 1);
      decode_shared.push_back(cache.shared[static_cast<size_t>(slot)]);
      decode_shared_at.push_back(cache.shared_at[static_cast<size_t>(slot)]);
      decode_range = std::max(decode_range, slot + 1);
      decode_len = std::max(decode_len, past + 1);
    } else {
      prefill_segments.push_back(i);
    }
    row += count;
  }
  auto slot_tokens = row;
  std::vector<int64_t> pool_pos;  // pool row of each fill token
  for (auto& f : input.fills) {
    if (f.at < 0 || f.past < 0 || f.count <= 0 || f.at + f.past + f.count > cache.pool_tokens() ||
        f.past + f.count > config_.max_position_embeddings)
      throw std::invalid_argument("a prompt-pool fill lies outside the pool");
    fill_start.push_back(row);
    for (int64_t t = 0; t < f.count; ++t) {
      pos_of.push_back(f.past + t);
      pool_pos.push_back(f.at + f.past + t);
    }
    row += f.count;
  }
  if (row != total)
    throw std::invalid_argument("step_input: " + std::to_string(total) + " tokens for segments of " +
                                std::to_string(row));
  bool any_shared = std::any_of(decode_shared.begin(), decode_shared.end(), [](int64_t n) { return n > 0; });
  // The CPU's decode-attention kernel (cpu_kernels.hpp) serves float32 caches on
  // the CPU while the CPU loops are on; the ATen path below it everything else.
  bool cpu_kernel =
      fused::enabled() &&
      (cache.keys.empty() || (cache.keys[0].scalar_type() == at::kFloat && cache.keys[0].device().is_cpu()));

  // Steady state: the step is decodes only and segment i is slot i; then the
  // queries and outputs need no gathering.
  bool all_decode_in_order = prefill_segments.empty() && input.fills.empty();
  for (size_t i = 0; all_decode_in_order && i < decode_slots.size(); ++i)
    all_decode_in_order = decode_slots[i] == static_cast<int64_t>(i);
  if (all_decode_in_order && !decode_rows.empty() && !any_shared && !cpu_kernel) {
    std::optional<at::Tensor> hidden;
    if (cache.graphs)
      hidden = cache.graphs->run(
          cache, input.tokens, pos_of, flat_.data_ptr(),
          [&](const at::Tensor& t, const at::Tensor& p, int64_t keys) { return decode_steady(cache, t, p, keys); });
    if (!hidden)
      hidden = decode_steady(cache, at::tensor(input.tokens, long_opts).to(device),
                             at::tensor(pos_of, long_opts).to(device), decode_len);
    for (size_t i = 0; i < input.slots.size(); ++i)
      cache.length[static_cast<size_t>(input.slots[i])] += input.counts[i];
    return *hidden;
  }

  auto tokens = at::tensor(input.tokens, long_opts).to(device);
  auto positions = at::tensor(pos_of, long_opts).to(device);
  // Row of each (token, kv head) in a cache tensor viewed as [slots * kv_heads * max_len, head_dim],
  // and of each fill token in a pool tensor viewed as [kv_heads * pool_tokens, head_dim]: on the host
  // for the CPU loops' writes, on the device (made at the first use) for index_copy_.
  std::vector<int64_t> host_cache_rows, host_pool_rows;
  for (int64_t t = 0; t < slot_tokens; ++t)
    for (int64_t h = 0; h < kv_heads; ++h)
      host_cache_rows.push_back((slot_of[static_cast<size_t>(t)] * kv_heads + h) * cache.max_len() +
                                pos_of[static_cast<size_t>(t)]);
  for (auto p : pool_pos)
    for (int64_t h = 0; h < kv_heads; ++h)
      host_pool_rows.push_back(h * cache.pool_tokens() + p);
  at::Tensor cache_rows, pool_rows;
  auto on_device = [&](at::Tensor& rows, const std::vector<int64_t>& host) -> const at::Tensor& {
    if (!rows.defined())
      rows = at::tensor(host, long_opts).to(device);
    return rows;
  };
  at::Tensor decode_row_index, decode_slot_index, decode_mask;
  bool batched_aten = !cpu_kernel && !decode_rows.empty() && !any_shared;
  // The gathers only a step that is not decodes-in-slot-order needs (not the steady state).
  if (!decode_rows.empty() && !all_decode_in_order) {
    decode_row_index = at::tensor(decode_rows, long_opts).to(device);
    decode_slot_index = at::tensor(decode_slots, long_opts).to(device);
  }
  if (batched_aten) {
    // Keys beyond each decoding slot's length are masked; slots in the range that do
    // not decode this step attend to position 0 only (their rows are discarded).
    std::vector<int64_t> lens(static_cast<size_t>(decode_range), 1);
    for (size_t i = 0; i < decode_slots.size(); ++i)
      lens[static_cast<size_t>(decode_slots[i])] = decode_lengths[i];
    auto len_t = at::tensor(lens, long_opts).to(device);
    decode_mask = at::arange(decode_len, long_opts.device(device)).unsqueeze(0).ge(len_t.unsqueeze(1));  // [range, L]
    decode_mask = decode_mask.view({decode_range, 1, 1, decode_len});
  }

  auto angles = rotary_for(positions);
  auto x = embed_.index_select(0, tokens);
  // Products in float32 without autocast (which does not cast in-place operations).
  bool in_place_residual = compute_ == at::kFloat && x.scalar_type() == at::kFloat;
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto& layer = layers_[l];
    auto& ck = cache.keys[l];
    auto& cv = cache.values[l];
    auto [q, k, v] = project_qkv(layer, rms_norm(x, layer.input_norm), angles);
    // Append to the cache: cache[slot, head, pos] = k[row, head], as rows of a flat view; fill tokens
    // (after the slot tokens) likewise to the prompt pool. The CPU loops copy the rows from where the
    // projection left them. (In bfloat16 compute k and v arrive in the products' type; the cache keeps the model's.)
    bool rows_as_they_lie = cpu_kernel && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
                            k.stride(2) == 1 && k.stride(1) == d && v.stride(2) == 1 && v.stride(1) == d;
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
    append(ck, cache_rows, host_cache_rows, k, 0, slot_tokens);
    append(cv, cache_rows, host_cache_rows, v, 0, slot_tokens);
    if (!pool_pos.empty()) {
      append(cache.pool_keys[l], pool_rows, host_pool_rows, k, slot_tokens, total - slot_tokens);
      append(cache.pool_values[l], pool_rows, host_pool_rows, v, slot_tokens, total - slot_tokens);
    }
    // A slot's context keys and values [kv_heads, upto, head_dim]: its pool prefix, then its own rows.
    auto context = [&](int64_t slot, int64_t upto) {
      auto n = cache.shared[static_cast<size_t>(slot)];
      auto own_k = ck[slot].narrow(1, n, upto - n), own_v = cv[slot].narrow(1, n, upto - n);
      if (n == 0)
        return std::make_pair(own_k, own_v);
      auto at = cache.shared_at[static_cast<size_t>(slot)];
      return std::make_pair(at::cat({cache.pool_keys[l].narrow(1, at, n), own_k}, 1),
                            at::cat({cache.pool_values[l].narrow(1, at, n), own_v}, 1));
    };
    auto attn = at::empty({total, config_.num_attention_heads * d}, x.options());
    if (!decode_rows.empty() && cpu_kernel) {
      auto n = static_cast<int64_t>(decode_rows.size());
      // The queries as they lie in the projection's output when they can be read there.
      bool q_as_it_lies = all_decode_in_order && q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == d;
      auto qd = q_as_it_lies ? q
                             : (all_decode_in_order ? q.narrow(0, 0, n) : q.index_select(0, decode_row_index))
                                   .to(at::kFloat)
                                   .contiguous();
      auto out = at::empty({n, config_.num_attention_heads * d}, qd.options());
      cpu::decode_attention_args a;
      a.q = qd.data_ptr<float>();
      a.q_stride = qd.stride(0);
      a.out = out.data_ptr<float>();
      a.keys = ck.data_ptr<float>();
      a.values = cv.data_ptr<float>();
      if (any_shared) {
        a.pool_keys = cache.pool_keys[l].data_ptr<float>();
        a.pool_values = cache.pool_values[l].data_ptr<float>();
      }
      a.slot = decode_slots.data();
      a.length = decode_lengths.data();
      a.shared = decode_shared.data();
      a.shared_at = decode_shared_at.data();
      a.batch = n;
      a.kv_heads = kv_heads;
      a.group = group;
      a.head_dim = d;
      a.max_len = cache.max_len();
      a.pool_len = cache.pool_tokens();
      a.scale = static_cast<float>(scale);
      cpu::decode_attention(a);
      if (all_decode_in_order && n == total)
        attn = out.to(x.scalar_type());
      else
        attn.index_copy_(0, decode_row_index, out.to(attn.scalar_type()));
    } else if (batched_aten) {
      // Decodes out of slot order (beside prefills; the steady step is decode_steady):
      // queries gathered into slot rows [0, decode_range), all attended at once.
      auto qd = at::zeros({decode_range, config_.num_attention_heads, d}, q.options());
      qd.index_copy_(0, decode_slot_index, q.index_select(0, decode_row_index).to(qd.scalar_type()));
      auto out =
          attend_decode_slots(qd.view({decode_range, kv_heads, group, d}), ck, cv, decode_len, decode_mask, scale);
      attn.index_copy_(0, decode_row_index, out.index_select(0, decode_slot_index).to(attn.scalar_type()));
    } else {
      // Decodes with pool prefixes off the fused path: one at a time.
      for (size_t i = 0; i < decode_rows.size(); ++i) {
        auto [keys, vals] = context(decode_slots[i], decode_lengths[i]);
        auto qs = q.narrow(0, decode_rows[i], 1).view({1, kv_heads, group, d});
        attn.narrow(0, decode_rows[i], 1).copy_(attend(qs, keys, vals, decode_lengths[i] - 1, scale));
      }
    }
    for (auto i : prefill_segments) {
      auto slot = input.slots[i], count = input.counts[i], start = segment_start[i];
      auto past = cache.length[static_cast<size_t>(slot)];
      auto qs = q.narrow(0, start, count).view({count, kv_heads, group, d});
      auto [keys, vals] = context(slot, past + count);
      attn.narrow(0, start, count).copy_(attend(qs, keys, vals, past, scale));
    }
    for (size_t f = 0; f < input.fills.size(); ++f) {
      auto& fill = input.fills[f];
      auto qs = q.narrow(0, fill_start[f], fill.count).view({fill.count, kv_heads, group, d});
      auto keys = cache.pool_keys[l].narrow(1, fill.at, fill.past + fill.count);
      auto vals = cache.pool_values[l].narrow(1, fill.at, fill.past + fill.count);
      attn.narrow(0, fill_start[f], fill.count).copy_(attend(qs, keys, vals, fill.past, scale));
    }
    if (in_place_residual) {
      // x is this step's own tensor: the products add into it (no sum tensor, no extra pass).
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

void policy_model::set_compute_dtype(const std::string& name) {
  compute_ = parse_compute_dtype(name);
  config_.compute_dtype = name;
}

at::Tensor policy_model::logits(const at::Tensor& hidden) const {
  compute_precision precision(compute_);
  return at::linear(hidden, lm_head_);
}

}  // namespace areal::kernels
