// The steady decode step on a CUDA device as captured CUDA graphs. Eagerly, a
// decode step of a small model launches about a thousand kernels (some forty a
// layer), and on a GPU the host's launching, not the device, sets its time:
// bench_device measured 10 ms a step at every batch from 1 to 256 where the
// bytes the step reads take 0.3 ms. A replayed graph launches them all at once.
//
// A graph has fixed shapes, so steps are padded up to buckets: the batch to a
// power of two (at most the cache's slots), the keys attended to a multiple of
// 256 (or of an eighth of a longer context). Padding rows decode into the
// cache's slots beyond the batch, at a position no sequence has reached (its
// length), which every sequence writes before it attends to it: the padding
// changes nothing a real row sees, and its own rows are discarded.
//
// Built only against a LibTorch with CUDA (AREAL_CUDA_GRAPHS); elsewhere
// available() is false and every step runs eagerly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

namespace areal::kernels {

struct kv_cache;

class decode_graphs {
 public:
  /// The step itself on device tensors: tokens [batch], positions [batch] (slot i
  /// decodes at positions[i]), attending to the first `keys` cache positions;
  /// returns the final hidden states [batch, hidden].
  using step_body = std::function<at::Tensor(const at::Tensor& tokens, const at::Tensor& positions, int64_t keys)>;

  /// Whether this build can capture CUDA graphs.
  static bool available();

  decode_graphs();
  ~decode_graphs();
  decode_graphs(const decode_graphs&) = delete;
  decode_graphs& operator=(const decode_graphs&) = delete;

  /// Hidden states [n, hidden] of slots 0..n-1 decoding tokens[i] at positions[i],
  /// through the graph of this step's buckets (captured on first use: that step
  /// runs eagerly, then is recorded). `weights` identifies the parameters the
  /// graphs read: when it or the cache's storage changes, the graphs are dropped.
  /// nullopt when the step cannot be padded (a padding slot is full): run it eagerly.
  std::optional<at::Tensor> run(kv_cache& cache, const std::vector<int64_t>& tokens,
                                const std::vector<int64_t>& positions, const void* weights, const step_body& body);

  uint64_t replays() const { return replays_; }
  uint64_t captures() const { return captures_; }

 private:
  struct state;
  std::unique_ptr<state> state_;
  uint64_t replays_ = 0, captures_ = 0;
};

/// The key count a graph attends to for a step that needs `needed` (<= max_len).
int64_t graph_key_bucket(int64_t needed, int64_t max_len);
/// The batch a graph decodes for a step of `n` rows (<= slots).
int64_t graph_batch_bucket(int64_t n, int64_t slots);

}  // namespace areal::kernels
