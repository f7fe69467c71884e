#include "areal/kernels/kv_cache.hpp"
#include "decode_graphs.hpp"

#include <algorithm>

namespace areal::kernels {

kv_cache::kv_cache(const model_config& config, int64_t slots, int64_t max_len, at::TensorOptions options,
                   int64_t pool_tokens)
    : max_len_(max_len) {
  auto kv = config.num_key_value_heads, d = config.head_dim();
  auto rows = options.device().is_cpu() ? std::min(max_len, initial_cpu_rows) : max_len;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    // Zeros, not garbage: the ATen decode path reads every slot up to the longest position (masked).
    keys.push_back(at::zeros({slots, kv, rows, d}, options));
    values.push_back(at::zeros({slots, kv, rows, d}, options));
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

void kv_cache::reserve(int64_t needed) {
  auto now = rows();
  if (needed <= now || keys.empty())
    return;
  auto grown = std::min(max_len_, std::max(needed, 2 * now));
  auto grow = [&](at::Tensor& t) {
    auto bigger = at::empty({t.size(0), t.size(1), grown, t.size(3)}, t.options());
    bigger.narrow(2, 0, now).copy_(t);
    bigger.narrow(2, now, grown - now).zero_();
    t = std::move(bigger);
  };
  for (size_t l = 0; l < keys.size(); ++l) {
    grow(keys[l]);
    grow(values[l]);
  }
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
