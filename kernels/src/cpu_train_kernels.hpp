// Hand-written CPU loops for the element-wise layers of a training step, where
// ATen runs several passes (and as many temporaries) forward and more backward:
// RMSNorm, rotary embeddings of q and k, and SwiGLU, one pass each way.
//
// Scope: float32, contiguous row-major buffers, CPU (fused_layers.cpp checks
// and falls back to ATen otherwise). Rows are split over ATen's intra-op
// threads; each copy is compiled for AVX-512, AVX2 and a baseline
// (cpu_isa.hpp).
#pragma once

#include <cstdint>

namespace areal::kernels::cpu {

/// y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps), saved per row.
///   x, y: [rows, n]; w: [n]; rstd: [rows]
void rms_norm_forward(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y, float* rstd);

/// The gradients of rms_norm_forward: dx [rows, n] and dw [n] (overwritten).
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows, int64_t n,
                       float* dx, float* dw);

/// out = silu(g) * u, where each row of gate_up is g (the first `width`
/// columns) then u.  gate_up: [rows, 2 * width]; out: [rows, width]
void swiglu_forward(const float* gate_up, int64_t rows, int64_t width, float* out);

/// The gradient of swiglu_forward: d_gate_up [rows, 2 * width] (g's columns, then u's).
void swiglu_backward(const float* d_out, const float* gate_up, int64_t rows, int64_t width, float* d_gate_up);

/// Rotary embedding (Hugging Face's rotate-half convention) of the first
/// `rotated` columns of each row of x, as heads of width head_dim:
/// y = x * cos + rotate_half(x) * sin, with cos and sin [rows, head_dim] the
/// row's angles; the remaining columns are copied. With `inverse` the
/// transposed rotation (each column's partner read with the partner's sine):
/// the backward pass.
///   x, y: [rows, width]
void rotary(const float* x, const float* cos, const float* sin, int64_t rows, int64_t width, int64_t rotated,
            int64_t head_dim, bool inverse, float* y);

}  // namespace areal::kernels::cpu
