#include "areal/kernels/model.hpp"
#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/precision.hpp"
#include "areal/runtime/files.hpp"
#include "aten_attention.hpp"
#include "cpu_train_kernels.hpp"
#include "packed_weights.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

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
  return qkv_heads(at::linear(h, layer.qkv_w, layer.qkv_b), angles);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> policy_model::qkv_heads(const at::Tensor& qkv,
                                                                       const rotary& angles) const {
  auto total = qkv.size(0), d = config_.head_dim();
  auto q_width = config_.num_attention_heads * d, kv_width = config_.num_key_value_heads * d;
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
  return swiglu(fused::linear(m, layer.gate_up_w));  // [T, 2 I]: gate then up
}

at::Tensor policy_model::swiglu(const at::Tensor& gate_up) const {
  if (fused::applies(gate_up))
    return fused::swiglu(gate_up);
  auto halves = gate_up.chunk(2, 1);
  return at::silu(halves[0]) * halves[1];
}

at::Tensor policy_model::mlp(const layer_views& layer, const at::Tensor& m) const {
  return fused::linear(mlp_activations(layer, m), layer.down_w);
}

at::Tensor policy_model::forward(const at::Tensor& tokens, const std::vector<int64_t>& cu_seqlens,
                                 const std::vector<int64_t>& parents) const {
  auto total = tokens.size(0);
  if (cu_seqlens.size() < 2 || cu_seqlens.front() != 0 || cu_seqlens.back() != total)
    throw std::invalid_argument("cu_seqlens must run from 0 to the number of tokens");
  if (!parents.empty())
    if (auto why = cpu::check_parents(cu_seqlens, parents); !why.empty())
      throw std::invalid_argument("forward: " + why);
  std::vector<int64_t> lengths;
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s)
    lengths.push_back(cu_seqlens[s + 1] - cu_seqlens[s]);
  auto parent_of = [&](size_t s) { return parents.empty() ? int64_t{-1} : parents[s]; };
  compute_precision precision(compute_);
  auto d = config_.head_dim(), kv_heads = config_.num_key_value_heads;
  auto group = config_.num_attention_heads / kv_heads;
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<int64_t> pos;
  pos.reserve(static_cast<size_t>(total));
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    auto start = parent_of(s) < 0 ? 0 : lengths[static_cast<size_t>(parent_of(s))];  // after its parent's
    for (int64_t p = 0; p < lengths[s]; ++p)
      pos.push_back(start + p);
  }
  if (!pos.empty() && *std::max_element(pos.begin(), pos.end()) >= config_.max_position_embeddings)
    throw std::invalid_argument("a sequence is longer than max_position_embeddings");
  auto positions = at::tensor(pos, at::TensorOptions().dtype(at::kLong)).to(flat_.device());
  auto angles = rotary_for(positions);
  auto x = embed_.index_select(0, tokens.to(flat_.device()));
  std::optional<detail::packed_attention_plan> packed;  // ATen's path: made at the first layer, for all
  auto heads = config_.num_attention_heads, q_width = heads * d, kv_width = kv_heads * d;
  for (auto& layer : layers_) {
    auto qkv = fused::linear(rms_norm(x, layer.input_norm), layer.qkv_w, layer.qkv_b);  // [T, q + 2 kv]
    at::Tensor attended;
    if (fused::attention_applies(qkv, d) && fused::applies(angles.cos)) {
      // The CPU's own loops: each query against the keys it may see, q, k and v read from the rotated rows.
      auto rotated =
          fused::rotary(qkv, angles.cos.view({total, d}), angles.sin.view({total, d}), q_width + kv_width, d);
      attended = fused::causal_attention(rotated, cu_seqlens, heads, kv_heads, d, parents);
    } else {
      auto [q, k, v] = qkv_heads(qkv, angles);
      if (!packed)
        packed = detail::plan_packed_attention(lengths, parents, group, kv_heads, x.options().requires_grad(false));
      attended = detail::attend_packed(*packed, q, k, v, scale);
    }
    x = x + fused::linear(attended, layer.o_w);
    x = x + mlp(layer, rms_norm(x, layer.post_norm));
  }
  return rms_norm(x, final_norm_);
}

void policy_model::set_compute_dtype(const std::string& name) {
  compute_ = parse_compute_dtype(name);
  config_.compute_dtype = name;
}

at::Tensor policy_model::logits(const at::Tensor& hidden) const {
  if (hidden.dim() == 2 && compute_ == at::kFloat && !at::GradMode::is_enabled() &&
      packed_weights::applies(hidden, hidden.size(0))) {
    std::shared_ptr<const packed_weights> packed;
    {
      std::lock_guard<std::mutex> lock(packed_.mutex);
      packed = packed_.current;  // only one a decode step has built: a training model packs nothing
    }
    if (packed && packed->version == flat_._version() && packed->data == flat_.data_ptr())
      return packed->output.product(hidden.contiguous());
  }
  compute_precision precision(compute_);
  return at::linear(hidden, lm_head_);
}

std::shared_ptr<const packed_weights> policy_model::packed_for(const at::Tensor& x, int64_t rows) const {
  if (compute_ != at::kFloat || flat_.scalar_type() != at::kFloat || !packed_weights::applies(x, rows))
    return nullptr;
  std::lock_guard<std::mutex> lock(packed_.mutex);
  auto& current = packed_.current;
  if (current && current->version == flat_._version() && current->data == flat_.data_ptr())
    return current;
  current.reset();  // the old copy's memory back before the new one is made
  auto fresh = std::make_shared<packed_weights>();
  for (auto& layer : layers_)
    fresh->layers.push_back({packed_matrix(layer.qkv_w, layer.input_norm), packed_matrix(layer.o_w),
                             packed_matrix::swiglu_of(layer.gate_up_w, layer.post_norm), packed_matrix(layer.down_w)});
  fresh->output = packed_matrix(lm_head_);
  fresh->version = flat_._version();
  fresh->data = flat_.data_ptr();
  current = std::move(fresh);
  return current;
}

}  // namespace areal::kernels
