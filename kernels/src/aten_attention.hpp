// ATen attention of new query tokens against their keys, shared by the full
// forward pass (model.cpp, where it is defined) and the cached one
// (model_decode.cpp).
#pragma once

#include <ATen/ATen.h>

namespace areal::kernels::detail {

// The causal mask of `count` new query tokens against `past + count` keys as an
// additive bias: 0 where query t (at position past + t) may see the key, -inf
// where the key lies in its future. One row per (query, head of the group):
// row = t * group + g.
at::Tensor causal_bias(int64_t count, int64_t past, int64_t group, const at::TensorOptions& options);

// Scaled dot-product attention of `count` new query tokens against `past + count`
// keys, causal: query t sees keys 0 .. past + t. The scale and the mask go into
// the score product itself (baddbmm: bias + scale * q k^T, one BLAS call), so no
// pass over the scores precedes the softmax; `bias` is causal_bias(count, past,
// group), which a caller attending many times at one shape computes once.
//   q [count, kv_heads, group, head_dim]; k, v [kv_heads, past + count, head_dim]
//   returns [count, kv_heads * group * head_dim]
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t past, double scale,
                  const at::Tensor& bias = {});

}  // namespace areal::kernels::detail
