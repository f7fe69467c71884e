// The weights the CPU decode step multiplies by, packed once per weight version
// for cpu::packed_product (cpu_packed_gemm.hpp): every layer's fused qkv, o,
// gate_up and down projections and the output projection.
//
// policy_model keeps one (model.hpp): forward_cached builds it at its first
// step on the CPU in float32 and again whenever flat() has changed since: its
// version counter moved (every ATen write into it, or into a view of it, moves
// it; the trainer's own optimizer loop moves it by hand) or the buffer is
// another. The cost: a second copy of the weights in memory, and one pass over
// them per weight update.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace areal::kernels {

struct packed_matrix {
  at::Tensor data;  // cpu::pack_weight's panels
  int64_t n = 0, k = 0;

  packed_matrix() = default;
  /// Packs w [n, k] (float32, CPU, contiguous).
  explicit packed_matrix(const at::Tensor& w);
  /// x [m, k] . w^T (+ bias): a new [m, n] tensor.
  at::Tensor product(const at::Tensor& x, const at::Tensor& bias = {}) const;
  /// y += x . w^T in place (y [m, n], contiguous float32).
  void add_product(at::Tensor& y, const at::Tensor& x) const;
};

struct packed_weights {
  struct layer {
    packed_matrix qkv, o, gate_up, down;
  };
  std::vector<layer> layers;
  packed_matrix output;        // the LM head [vocab, hidden]
  int64_t version = 0;         // flat()'s version counter when packed
  const void* data = nullptr;  // flat()'s buffer when packed

  /// Whether packed products serve a step of `rows` rows in x's type and place
  /// (float32 on the CPU while the fused loops are on, at most max_rows rows).
  static bool applies(const at::Tensor& x, int64_t rows);
  /// Rows beyond which OpenBLAS is as fast: the packed products over the `small`
  /// preset's 8 layers ran 1.4x OpenBLAS's rate at 64 rows, 1.13x at 512 and
  /// 0.98x at 2,048 (a probe, AMD EPYC, `SkylakeX` kernels, before the prefetch).
  static constexpr int64_t max_rows = 1024;
};

}  // namespace areal::kernels
