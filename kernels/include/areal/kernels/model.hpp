// The policy: a decoder-only transformer of the Qwen2/Llama family on ATen.
//
//   tokens -> embed -> L x [ x += attn(rmsnorm(x)); x += swiglu(rmsnorm(x)) ] -> rmsnorm -> lm_head
//   attention: grouped-query, rotary positions (Hugging Face convention), optional QKV bias,
//   causal within each sequence; several sequences are packed without padding.
//
// All parameters live in one contiguous buffer (`flat()`) with a view per
// Hugging Face tensor name, so that a weight update is one buffer plus its
// layout, and gradients land in one buffer too. Two forward paths share the
// same attention code: `forward` over whole packed sequences (training,
// reference) and `forward_cached` over new tokens against a KV cache (generation).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "areal/kernels/kv_cache.hpp"
#include "areal/kernels/model_config.hpp"
#include "areal/kernels/safetensors.hpp"

namespace areal::kernels {

struct packed_weights;  // the CPU decode step's packed weights (kernels/src/packed_weights.hpp)

struct parameter_entry {
  std::string name;  // Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, into flat()
  int64_t numel = 0;
};

class policy_model {
 public:
  explicit policy_model(model_config config, at::TensorOptions options = at::TensorOptions().dtype(at::kFloat));

  const model_config& config() const { return config_; }
  /// Precision of the forward pass's matrix products (config().compute_dtype).
  at::ScalarType compute_dtype() const { return compute_; }
  /// "float32" or "bfloat16" (throws std::invalid_argument otherwise).
  void set_compute_dtype(const std::string& name);
  at::TensorOptions options() const { return flat_.options(); }
  at::Tensor& flat() { return flat_; }
  const at::Tensor& flat() const { return flat_; }
  const std::vector<parameter_entry>& layout() const { return layout_; }
  /// A view of one parameter (throws format_error for an unknown name).
  at::Tensor parameter(const std::string& name) const;

  /// Normal(0, std) matrices and biases, unit norms; the same seed gives the same weights.
  void init_random(uint64_t seed, double std = 0.02);

  /// Hugging Face layout: config.json plus model.safetensors (or shards with an index).
  void save(const std::string& directory, uint64_t max_shard_bytes = 5ull << 30) const;
  static policy_model load(const std::string& directory,
                           at::TensorOptions options = at::TensorOptions().dtype(at::kFloat));
  /// Copies named tensors into the parameters; `source` names them in errors.
  void load_tensors(const tensor_map& tensors, const std::string& source);
  tensor_map to_tensors() const;

  /// Final hidden states [T, hidden] of packed whole sequences: tokens [T] (int64),
  /// sequence i spans [cu_seqlens[i], cu_seqlens[i+1]). Differentiable.
  /// `parents` (empty, or one per sequence): a sequence whose parent p is not -1
  /// continues sequence p, an earlier one that continues none: its tokens take
  /// the positions after p's and attend to p's (the samples of a group packed
  /// after their prompt, computed once).
  at::Tensor forward(const at::Tensor& tokens, const std::vector<int64_t>& cu_seqlens,
                     const std::vector<int64_t>& parents = {}) const;
  /// Final hidden states [T, hidden] of the step's new tokens; appends their keys
  /// and values to the cache. Not differentiable (generation only).
  at::Tensor forward_cached(kv_cache& cache, const step_input& input) const;
  /// Logits [.., vocab] of hidden states.
  at::Tensor logits(const at::Tensor& hidden) const;
  /// The output projection [vocab, hidden] (the embedding when tied).
  const at::Tensor& output_weight() const { return lm_head_; }
  /// Makes the parameters trainable (gradients accumulate in flat_grad()) or not.
  void set_trainable(bool trainable);
  /// Gradients of all parameters, laid out as flat() (undefined unless trainable).
  at::Tensor& flat_grad() { return flat_grad_; }

 private:
  struct rotary {
    at::Tensor cos, sin;  // [T, 1, head_dim]
  };
  struct layer_views {
    at::Tensor input_norm, qkv_w, qkv_b, o_w, post_norm, gate_up_w,
        down_w;  // qkv and gate_up: adjacent parameters as one
  };
  int64_t offset_of(const std::string& name) const;
  std::tuple<at::Tensor, at::Tensor, at::Tensor> project_qkv(const layer_views& layer, const at::Tensor& h,
                                                             const rotary& angles) const;
  // q [T, heads, head_dim], k and v [T, kv_heads, head_dim] from the fused projection's rows, q and k rotated.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_heads(const at::Tensor& qkv, const rotary& angles) const;
  at::Tensor mlp(const layer_views& layer, const at::Tensor& m) const;
  at::Tensor mlp_activations(const layer_views& layer, const at::Tensor& m) const;  // SwiGLU, before down_w
  at::Tensor swiglu(const at::Tensor& gate_up) const;  // silu(gate) * up of the gate_up product's rows
  // The packed weights for a step of `rows` rows like x: current (packed again
  // if flat() changed since), or null where packed products do not apply.
  std::shared_ptr<const packed_weights> packed_for(const at::Tensor& x, int64_t rows) const;
  void bind_views();
  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) const;
  rotary rotary_for(const at::Tensor& positions) const;
  // The steady decode step, eagerly or as a captured CUDA graph's body: slot i
  // decodes tokens[i] at positions[i] for every slot i < tokens.size(0), none
  // reading a shared prefix, each attending to at most the first `keys` positions.
  // Single-token queries q [slots, kv_heads, group, head_dim] of cache slots 0..slots-1
  // against their first `keys` cached positions, hidden_keys [slots, 1, 1, keys] masked.
  static at::Tensor attend_decode_slots(const at::Tensor& q, const at::Tensor& cache_keys,
                                        const at::Tensor& cache_values, int64_t keys, const at::Tensor& hidden_keys,
                                        double scale);
  at::Tensor decode_steady(kv_cache& cache, const at::Tensor& tokens, const at::Tensor& positions, int64_t keys) const;
  at::Tensor rotate(const at::Tensor& x, const rotary& angles) const;

  model_config config_;
  at::ScalarType compute_ = at::kFloat;
  at::Tensor flat_;
  at::Tensor flat_grad_;
  std::vector<parameter_entry> layout_;
  at::Tensor embed_, final_norm_, lm_head_;
  std::vector<layer_views> layers_;
  at::Tensor rope_cos_, rope_sin_;  // [max_position_embeddings, head_dim], float32
  // Built by the first CPU decode step; a copied model starts without (its buffer is another).
  struct packed_holder {
    packed_holder() = default;
    packed_holder(const packed_holder&) {}
    packed_holder& operator=(const packed_holder&) {
      std::lock_guard<std::mutex> lock(mutex);
      current.reset();
      return *this;
    }
    std::mutex mutex;
    std::shared_ptr<const packed_weights> current;
  };
  mutable packed_holder packed_;
};

}  // namespace areal::kernels
