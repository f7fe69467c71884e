// The generation engine's KV cache: per-slot keys and values, a prompt pool
// that slots can share, and the new tokens of one step (policy_model::forward_cached).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "areal/kernels/model_config.hpp"

namespace areal::kernels {

class decode_graphs;  // decode_graphs.hpp (kernels' own)

/// Keys and values of `slots` sequences of up to `max_len` tokens,
/// plus a prompt pool of `pool_tokens` rows that sequences can share: a slot
/// whose first `shared` context tokens are a pool prefix (the prompt its group
/// has in common) reads them from pool rows [shared_at, shared_at + shared) and
/// keeps only its own tokens, at their positions [shared, length), in its slot.
///
/// On a CPU the slots start with room for `initial_cpu_rows` tokens and grow
/// (doubling, at most to max_len) as their longest sequence does: the full
/// cache of a short workload (64 slots x 1,024 tokens: 256 MB for the tiny
/// preset) was zeroed page by page at every engine's start, most of the
/// demo's system time, for sequences of tens of tokens. Elsewhere (CUDA graphs
/// hold the tensors' addresses) it has max_len rows from the start.
struct kv_cache {
  static constexpr int64_t initial_cpu_rows = 128;
  kv_cache(const model_config& config, int64_t slots, int64_t max_len, at::TensorOptions options,
           int64_t pool_tokens = 0);
  std::vector<at::Tensor> keys;         // per layer: [slots, kv_heads, rows(), head_dim]
  std::vector<at::Tensor> values;       // same
  std::vector<int64_t> length;          // context tokens per slot, a shared prefix included
  std::vector<int64_t> shared;          // of which read from the pool (0: none)
  std::vector<int64_t> shared_at;       // pool row of the first shared token
  std::vector<at::Tensor> pool_keys;    // per layer: [kv_heads, pool_tokens, head_dim]
  std::vector<at::Tensor> pool_values;  // same
  /// On a CUDA device (in a build with CUDA): the captured graphs of the steady
  /// decode step over this cache's tensors; null where steps run eagerly.
  std::shared_ptr<decode_graphs> graphs;
  int64_t slots() const { return static_cast<int64_t>(length.size()); }
  /// The longest sequence a slot may hold.
  int64_t max_len() const { return max_len_; }
  /// The rows a slot has room for now (the stride of a slot's rows); at most max_len.
  int64_t rows() const { return keys.empty() ? 0 : keys[0].size(2); }
  /// Room for `rows` tokens per slot (at most max_len): grows the slots, keeping their contents.
  void reserve(int64_t rows);
  int64_t pool_tokens() const { return pool_keys.empty() ? 0 : pool_keys[0].size(1); }
  /// Copies slot `from` into slot `to` (compaction when a sequence leaves).
  void move_slot(int64_t from, int64_t to);
  /// Makes slot empty, or (shared > 0) a context of `shared` pool tokens starting at pool row `at`.
  void reset_slot(int64_t slot, int64_t shared = 0, int64_t at = 0);
  /// Copies `count` pool rows (every layer) from row `from` to row `to` (ranges must not overlap).
  void copy_pool_rows(int64_t from, int64_t to, int64_t count);
  /// Copies the first `count` rows of a slot that holds them itself into pool rows from `to`.
  void copy_slot_to_pool(int64_t slot, int64_t to, int64_t count);

 private:
  int64_t max_len_ = 0;
};

/// New tokens of one generation step: segment i appends counts[i] tokens to
/// slot slots[i]; then each pool fill writes the keys and values of its tokens
/// into pool rows [at + past, at + past + count), the first `past` rows of that
/// prefix already being there. `tokens` holds the slot segments' tokens, then the fills'.
struct pool_fill {
  int64_t at = 0, past = 0, count = 0;
};
struct step_input {
  std::vector<int64_t> tokens;
  std::vector<int64_t> slots;
  std::vector<int64_t> counts;
  std::vector<pool_fill> fills = {};
};

}  // namespace areal::kernels
