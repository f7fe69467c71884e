#include "areal/kernels/kv_cache.hpp"
#include "decode_graphs.hpp"

namespace areal::kernels {

kv_cache::kv_cache(const model_config& config, int64_t slots, int64_t max_len, at::TensorOptions options,
                   int64_t pool_tokens) {
  auto kv = config.num_key_value_heads, d = config.head_dim();
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    keys.push_back(at::zeros({slots, kv, max_len, d}, options));
    values.push_back(at::zeros({slots, kv, max_len, d}, options));
    if (pool_tokens > 0) {
      pool_keys.push_back(at::zeros({kv, pool_tokens, d}, options));
      pool_values.push_back(at::zeros({kv, pool_tokens, d}, options));
    }
  }
  if (options.device().is_cuda() && decode_graphs::available())
    graphs = std::make_shared<decode_graphs>();
  length.assign(static_cast<size_t>(slots), 0);
  shared.assign(static_cast<size_t>(slots), 0);
  shared_at.assign(static_cast<size_t>(slots), 0);
}

void kv_cache::move_slot(int64_t from, int64_t to) {
  if (from == to)
    return;
  auto f = static_cast<size_t>(from), t = static_cast<size_t>(to);
  auto own_begin = shared[f], own = length[f] - shared[f];  // pool rows stay where they are
  for (size_t l = 0; l < keys.size(); ++l) {
    keys[l][to].narrow(1, own_begin, own).copy_(keys[l][from].narrow(1, own_begin, own));
    values[l][to].narrow(1, own_begin, own).copy_(values[l][from].narrow(1, own_begin, own));
  }
  length[t] = length[f];
  shared[t] = shared[f];
  shared_at[t] = shared_at[f];
  reset_slot(from);
}

void kv_cache::reset_slot(int64_t slot, int64_t shared_tokens, int64_t at) {
  auto s = static_cast<size_t>(slot);
  length[s] = shared_tokens;
  shared[s] = shared_tokens;
  shared_at[s] = at;
}

void kv_cache::copy_pool_rows(int64_t from, int64_t to, int64_t count) {
  for (size_t l = 0; l < pool_keys.size(); ++l) {
    pool_keys[l].narrow(1, to, count).copy_(pool_keys[l].narrow(1, from, count));
    pool_values[l].narrow(1, to, count).copy_(pool_values[l].narrow(1, from, count));
  }
}

void kv_cache::copy_slot_to_pool(int64_t slot, int64_t to, int64_t count) {
  for (size_t l = 0; l < pool_keys.size(); ++l) {
    pool_keys[l].narrow(1, to, count).copy_(keys[l][slot].narrow(1, 0, count));
    pool_values[l].narrow(1, to, count).copy_(values[l][slot].narrow(1, 0, count));
  }
}

}  // namespace areal::kernels
