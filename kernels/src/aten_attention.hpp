// ATen attention of new query tokens against their keys, shared by the full
// forward pass (model.cpp) and the cached one (model_decode.cpp); defined in
// aten_attention.cpp. The path of every device but the CPU in float32, whose
// own loops are cpu_attention.cpp and cpu_train_attention.cpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

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

// The attention of packed sequences (the full forward pass) in a few batched
// products instead of a handful of operations per sequence: on a GPU each is a
// kernel launch, and a training batch of 64 sequences over 24 layers launched
// thousands. Sequences are padded to buckets of similar length (sorted by how
// many keys they see), each bucket's scores at most `budget` elements; padded
// slots are masked out and their rows dropped again. The plan depends only on
// the lengths and parents, so one forward pass makes it once for every layer.
struct packed_attention_plan {
  struct bucket {
    int64_t sequences = 0, queries = 0, keys = 0;  // queries and keys: the longest member's, padded to
    at::Tensor query_rows;  // [sequences * queries] token row of each query slot (padding: row 0)
    at::Tensor key_rows;    // [sequences * keys] token row of each key slot: the parent's rows, then its own
    at::Tensor bias;        // [sequences, queries * group, keys]: 0 where the slot's query may see the key
    at::Tensor real_slots;  // the query slots that are real tokens, in the bucket's order
  };
  std::vector<bucket> buckets;
  at::Tensor token_order;  // for each token row, its row in the buckets' real slots concatenated
};

// `lengths` of the packed sequences and `parents` (empty, or one per sequence:
// -1, or an earlier sequence whose keys come first, as policy_model::forward);
// tensors made with `options` (the bias in its dtype, on its device).
packed_attention_plan plan_packed_attention(const std::vector<int64_t>& lengths, const std::vector<int64_t>& parents,
                                            int64_t group, int64_t kv_heads, const at::TensorOptions& options,
                                            int64_t budget = int64_t{1} << 24);

//   q [T, kv_heads, group, head_dim]; k, v [T, kv_heads, head_dim] (T tokens, packed)
//   returns [T, kv_heads * group * head_dim], what attend gives each sequence
at::Tensor attend_packed(const packed_attention_plan& plan, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, double scale);

}  // namespace areal::kernels::detail
