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
  at::Tensor data;     // cpu::pack_weight's (or cpu::pack_swiglu's) panels
  int64_t n = 0, k = 0;  // the product's output columns (SwiGLU: the width, half the weight's rows) and depth
  bool swiglu = false;

  packed_matrix() = default;
  /// Packs w [n, k] (float32, CPU, contiguous); with input_norm [k] (an RMSNorm's weight) folded in: then the
  /// product of x times inverse_rms(x) is the product of the normalized x.
  explicit packed_matrix(const at::Tensor& w, const at::Tensor& input_norm = {});
  /// Packs a SwiGLU gate_up weight [2 width, k] (cpu::pack_swiglu): its product is silu(gate) * up [m, width].
  static packed_matrix swiglu_of(const at::Tensor& gate_up, const at::Tensor& input_norm = {});
  /// x [m, k] . w^T (+ bias), row r times row_scale[r] (float32 [m]) when given: a new [m, n] tensor.
  at::Tensor product(const at::Tensor& x, const at::Tensor& bias = {}, const at::Tensor& row_scale = {}) const;
  /// y += x . w^T in place (y [m, n], contiguous float32).
  void add_product(at::Tensor& y, const at::Tensor& x) const;
};

/// 1 / sqrt(mean(x[r]^2) + eps) of each row of x [m, k] (float32, CPU): the row
/// scale of a product whose weight has the RMSNorm's weight folded in.
at::Tensor inverse_rms(const at::Tensor& x, double eps);

struct packed_weights {
  // qkv and gate_up have their layer's input and post-attention RMSNorm weights
  // folded in (their products take inverse_rms of the residual stream); gate_up
  // is packed for SwiGLU.
  struct layer {
    packed_matrix qkv, o, gate_up, down;
  };
  std::vector<layer> layers;
  packed_matrix output;        // the LM head [vocab, hidden]
  int64_t version = 0;         // flat()'s version counter when packed
  const void* data = nullptr;  // flat()'s buffer when packed
  /// Whether packed products serve a step of `rows` rows in x's type and place
  /// (float32 on the CPU while the fused loops are on; any number of rows).
  /// Steps of more than 1,024 rows once went to OpenBLAS, as fast there with
  /// `SkylakeX` kernels (0.98x at 2,048 rows on `small`); with any other core
  /// type it is slower: a re-prefill of 2,080 rows in `bench_generation` cost
  /// 69-78 ms per 1k tokens on OpenBLAS's `Haswell` kernels, 45-46 on these
  /// (44-46 with `SkylakeX` either way).
  static bool applies(const at::Tensor& x, int64_t rows);
};

}  // namespace areal::kernels
