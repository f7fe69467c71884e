// ATen attention of new query tokens against the keys each may see, in a few
// batched operations for many sequences at once: the path of every device but
// the CPU in float32 (whose own loops are cpu_attention.cpp and
// cpu_train_attention.cpp), shared by the full forward pass (model.cpp: packed
// sequences, a sample after its group's prompt) and the cached one
// (model_decode.cpp: prefills, re-prefills and prompt-pool fills against the KV
// cache and the pool). On a GPU each operation is a kernel launch; one sequence
// at a time made a handful per sequence per layer (thousands per step at batch
// 64 over 24 layers), a plan makes about a dozen per bucket per layer.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <vector>

namespace areal::kernels::detail {

// Where consecutive keys of a sequence lie: `length` keys in one of two sources
// (key tensors viewed as rows of head_dim: packed tokens, a KV cache, a prompt
// pool); key j of the span, for kv head h, is row base + j * step + h * head_stride.
struct key_span {
  int source = 0;  // 0 or 1
  int64_t base = 0, step = 1, head_stride = 0, length = 0;
};

// A sequence's `queries` new tokens (rows first_query, first_query + 1, ... of q)
// and the keys they attend to, causally: the queries are its last `queries` keys,
// so query t sees every key up to keys - queries + t.
struct attention_sequence {
  int64_t first_query = 0, queries = 0;
  std::vector<key_span> keys;
};

// Sequences padded into buckets of similar length (sorted by how many keys they
// see), each bucket's scores at most `budget` elements (0: 16 M on the CPU, where
// a larger bucket measured slower, 256 M elsewhere, where each bucket costs about
// eight kernel launches a layer and the scores' total is the same in any number
// of buckets); padded slots are masked out and their rows dropped again. The plan depends only on where the queries
// and keys lie, so a forward pass makes it once for every layer.
struct attention_plan {
  struct bucket {
    int64_t sequences = 0, queries = 0, keys = 0;  // queries and keys: the longest member's, padded to
    at::Tensor query_rows;                         // [sequences * queries] q row of each query slot (padding: row 0)
    std::array<at::Tensor, 2> key_rows;  // [sequences * kv_heads * keys] rows of each source (undefined: unused)
    at::Tensor from_second;              // [sequences, kv_heads, keys, 1]: the key is source 1's (where both are used)
    at::Tensor bias;                     // [sequences, 1, queries * group, keys]: 0 where the query may see the key
    at::Tensor real_slots;               // the query slots that are real tokens, in the bucket's order
  };
  std::vector<bucket> buckets;
  int64_t kv_heads = 0;
  at::Tensor rows;  // the q row of every real query slot, the buckets' in order: attend_planned's output rows
};

// Tensors made with `options` (the bias in its dtype, on its device). A padded
// query row sees key 0 (a row of -inf alone would give NaN). Sequences without
// queries are left out.
attention_plan plan_attention(const std::vector<attention_sequence>& sequences, int64_t group, int64_t kv_heads,
                              const at::TensorOptions& options, int64_t budget = 0);

// Scaled dot-product attention as the plan lays it out:
//   q [rows, kv_heads * group, head_dim] (query head = kv head * group + g);
//   keys[s], values[s]: source s viewed as [rows, head_dim] (undefined where no span reads it)
//   returns [plan.rows.size(0), kv_heads * group * head_dim], row i the attention of q row plan.rows[i]
at::Tensor attend_planned(const attention_plan& plan, const at::Tensor& q, const std::array<at::Tensor, 2>& keys,
                          const std::array<at::Tensor, 2>& values, double scale);

// The full forward pass's packed sequences: `lengths`, and `parents` (empty, or
// one per sequence: -1, or an earlier sequence whose keys come first, as
// policy_model::forward takes them).
struct packed_attention_plan {
  attention_plan plan;
  at::Tensor token_order;  // for each token row, its row in attend_planned's output
};
packed_attention_plan plan_packed_attention(const std::vector<int64_t>& lengths, const std::vector<int64_t>& parents,
                                            int64_t group, int64_t kv_heads, const at::TensorOptions& options,
                                            int64_t budget = 0);

//   q [T, kv_heads * group, head_dim]; k, v [T, kv_heads, head_dim] (T tokens, packed)
//   returns [T, kv_heads * group * head_dim]
at::Tensor attend_packed(const packed_attention_plan& packed, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, double scale);

}  // namespace areal::kernels::detail
