// The decode step's matrix products over weights packed once (cpu_packed_gemm.cpp).
//
// Why: a decode step multiplies a few dozen rows (one per sequence) by every
// weight of the model. OpenBLAS repacks the weight operand on every call: on
// the `small` preset at batch 64 its packing routine was 14% of the decode
// step's CPU time (`perf`), a copy of every weight, every step. Packed once per
// weight version, a product reads each weight once, straight from its panel.
//
// Layout: a weight w [n, k] (a Linear's, row-major: output j is row j) in
// panels of 16 output columns, each panel k rows of 16: packed[p][c][j] =
// w[16 p + j][c], zero past n; the panel count is rounded up to an even number
// (32 columns per block with AVX-512).
#pragma once

#include <cstdint>

namespace areal::kernels::cpu {

/// Floats the packed form of a weight [n, k] takes.
int64_t packed_size(int64_t n, int64_t k);
/// Packs w [n, k] (row stride k) into `packed` (packed_size(n, k) floats). With
/// column_scale [k], column c of w is multiplied by column_scale[c] first: the
/// weight of an RMSNorm before the product folded into it, so that the product
/// of the un-normalized rows times each row's inverse RMS (row_scale below) is
/// the product of the normalized rows.
void pack_weight(const float* w, int64_t n, int64_t k, float* packed, const float* column_scale = nullptr);
/// Floats the SwiGLU packing of a gate_up weight [2 width, k] takes.
int64_t packed_swiglu_size(int64_t width, int64_t k);
/// Packs a SwiGLU gate_up weight [2 width, k] (the gate's rows, then the up's)
/// so that a product's block holds gate columns 16b..16b+15 in its first panel
/// and the up's same columns in its second: the block's epilogue then writes
/// silu(gate) * up, and the [m, 2 width] product never exists. column_scale as
/// for pack_weight.
void pack_swiglu(const float* w, int64_t width, int64_t k, float* packed, const float* column_scale = nullptr);
/// y[r, 0..n) = (accumulate ? y[r, 0..n) : 0) + row_scale[r] * x[r, 0..k) . w^T (+ bias[0..n) when not null)
/// for rows r < m (row_scale 1 when null). x and y are row-major with row strides x_stride and y_stride;
/// y must not overlap x. With `swiglu` (a weight packed by pack_swiglu, n its width, no bias or accumulate):
/// y[r, j] = silu(g[r, j]) * u[r, j] of the gate and up products g and u, each scaled by row_scale[r].
/// Column blocks are balanced over ATen's intra-op threads (cpu_balanced.hpp).
struct packed_product_args {
  const float* x = nullptr;
  int64_t x_stride = 0;
  int64_t m = 0;
  const float* packed = nullptr;
  int64_t n = 0, k = 0;
  const float* bias = nullptr;
  const float* row_scale = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;
  bool accumulate = false;
  bool swiglu = false;
};
void packed_product(const packed_product_args& a);

}  // namespace areal::kernels::cpu
