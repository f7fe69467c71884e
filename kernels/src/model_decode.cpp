// The steady decode step (policy_model::forward_cached's common case): every
// slot of a batch decodes one token. Its own file: it has two bodies, op by op
// on ATen (any device; a CUDA graph records it as it is) and, on a GPU, the
// fused kernels of cuda_decode.hpp (nine a layer instead of some forty).
#include <cmath>
#include <limits>

#include "areal/kernels/kv_cache.hpp"
#include "areal/kernels/model.hpp"
#include "cuda_decode.hpp"

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
  // Row of each (slot, kv head)'s new key in a cache tensor viewed as [slots * kv_heads * max_len, head_dim].
  auto slot_heads = at::arange(batch * kv_heads, long_opts);  // slot * kv_heads + head
  auto cache_rows = slot_heads * cache.max_len() + positions.unsqueeze(1).expand({batch, kv_heads}).reshape({-1});
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

}  // namespace areal::kernels
