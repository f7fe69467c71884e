// Hand-written CPU loops for the element-wise layers of a training step, where
// ATen runs several passes (and as many temporaries) forward and more backward:
// RMSNorm, rotary embeddings of q and k, and SwiGLU, one pass each way; and
// the causal attention of packed sequences (cpu_train_attention.cpp).
//
// Scope: float32, contiguous row-major buffers, CPU (fused_layers.cpp checks
// and falls back to ATen otherwise). Rows are split over ATen's intra-op
// threads; each copy is compiled for AVX-512, AVX2 and a baseline
// (cpu_isa.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace areal::kernels::cpu {

/// y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps), saved per row.
///   x, y: [rows, n]; w: [n]; rstd: [rows]
void rms_norm_forward(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y, float* rstd);

/// out[r] = 1 / sqrt(mean(x[r]^2) + eps): rms_norm_forward's rstd alone, for
/// products that take the norm's weight folded into theirs (packed_weights.hpp).
///   x: [rows, n] with row stride x_stride; out: [rows]
void inverse_rms(const float* x, int64_t x_stride, int64_t rows, int64_t n, float eps, float* out);

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

/// One AdamW step, as trainer::apply_gradients composes it with ATen, over
/// elements [begin, end) of the flat parameters p, their gradient g (zeroed
/// after), and the moments m and v, in one pass (ATen's composition made about
/// ten passes and four full-size temporaries, on one thread):
///   g' = g * grad_scale; m = beta1 m + (1 - beta1) g'; v = beta2 v + (1 - beta2) g'^2;
///   p -= lr * ((m / bias1) / (sqrt(v / bias2) + eps) + weight_decay * p)
/// The caller splits the elements over its threads.
struct adamw_step {
  float grad_scale, beta1, beta2, bias1, bias2, eps, lr, weight_decay;
};
void adamw(float* p, float* g, float* m, float* v, int64_t begin, int64_t end, const adamw_step& a);

/// The sum of x[i]^2 over [begin, end), accumulated in double, on the calling thread.
double sum_of_squares(const float* x, int64_t begin, int64_t end);

/// Causal attention of packed sequences, read from and written to fused rows.
/// Sequence s holds rows cu_seqlens[s] .. cu_seqlens[s + 1]; its query t (heads
/// of head_dim columns at the start of its qkv row) sees keys 0 .. t of the same
/// sequence (kv_heads heads after the queries, values after them; query head h
/// uses kv head h / (heads / kv_heads)). Scores are scaled by `scale`.
/// With parents, a sequence whose parent p is not -1 continues p: its query t
/// sees every row of p, then its own rows 0 .. t (the samples of a group after
/// their shared prompt). A parent comes before its children and has no parent.
struct causal_attention_args {
  const float* qkv;  // [rows, row]: q heads, k heads, v heads
  int64_t row;       // floats per qkv row: (heads + 2 kv_heads) * head_dim
  int64_t heads, kv_heads, head_dim;
  float scale;
  const int64_t* cu_seqlens;  // sequences + 1 offsets
  int64_t sequences;
  float* out;  // [rows, heads * head_dim]: written by the forward
  float* lse;  // [rows, heads]: each query's log-sum-exp of its scores, written by the forward, read by the backward
  const int64_t* parents = nullptr;  // per sequence, the sequence it continues or -1; null: none does
};

/// Why `parents` (sequences long) cannot be the parents of causal_attention_args
/// over these cu_seqlens; empty when they can.
std::string check_parents(const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& parents);

/// Whether the loops take this head size (a multiple of 8).
bool causal_attention_supported(int64_t head_dim);

/// out and lse from qkv.
void causal_attention_forward(const causal_attention_args& a);

/// The gradient of the fused qkv rows, d_qkv [rows, row] (every element
/// written), from the output's gradient d_out [rows, heads * head_dim], the
/// forward's lse, and delta [rows, heads]: each query head's d_out . out (the
/// softmax gradient's row term, computed by the caller in one streaming pass:
/// read row by row inside the loop, out's rows missed the cache).
void causal_attention_backward(const causal_attention_args& a, const float* d_out, const float* delta, float* d_qkv);

}  // namespace areal::kernels::cpu
