// Hand-written CPU loops for the two hot paths of a decode step where ATen's
// small operations cost more than their arithmetic: attention of one new token
// per sequence against its cache, and drawing a token from a vocabulary row.
//
// Scope: float32, contiguous buffers, CPU. The callers keep ATen paths for
// everything else (other dtypes, other devices), and the tests compare the two.
// The loops are compiled for AVX-512, AVX2 and a baseline, chosen at load time
// by the CPU (GCC function multi-versioning), so the build stays portable.
#pragma once

#include <cstdint>

namespace areal::kernels::cpu {

/// Attention of one query token per sequence, grouped-query, no mask needed:
/// sequence b reads `shared[b]` positions from the prompt pool (rows
/// shared_at[b] .. of every kv head) and then its own rows
/// [shared[b], length[b]) of cache slot slot[b]. Softmax over both ranges
/// together (one pass of scores, then one of values). A prompt's token is such
/// a query too, its length ending at its own position.
///   q, out: [batch, kv_heads, group, head_dim]
///   keys, values: [slots, kv_heads, max_len, head_dim]
///   pool_keys, pool_values: [kv_heads, pool_len, head_dim] (unused when every shared[b] is 0)
struct decode_attention_args {
  const float* q = nullptr;
  float* out = nullptr;
  const float* keys = nullptr;
  const float* values = nullptr;
  const float* pool_keys = nullptr;
  const float* pool_values = nullptr;
  const int64_t* slot = nullptr;
  const int64_t* length = nullptr;
  const int64_t* shared = nullptr;
  const int64_t* shared_at = nullptr;
  int64_t batch = 0, kv_heads = 0, group = 0, head_dim = 0, max_len = 0, pool_len = 0;
  int64_t q_stride = 0;  // floats from one sequence's query row to the next; 0: kv_heads * group * head_dim
  float scale = 1;
  // Rotary and the cache write folded in, for a step of one new token per slot
  // (no two rows of one slot, no pool rows): q is then the qkv projection's
  // output as it lies (row b: its query heads, then its key heads, then its
  // value heads, none rotated yet; q_stride the row stride), and task (b, h)
  // first rotates its query heads in place and its key head by row b's angles
  // (Hugging Face's rotate-half) and writes key and value to row length[b] - 1
  // of its slot, then attends. Tasks touch disjoint rows and heads, so one
  // parallel pass does what took three. Null qkv: q is rotated and the cache
  // written already.
  struct {
    float* qkv = nullptr;        // = q, writable
    const float* cos = nullptr;  // [batch, head_dim]
    const float* sin = nullptr;
    float* keys = nullptr;  // = keys and values above, writable
    float* values = nullptr;
  } append;
};
void decode_attention(const decode_attention_args& a);

/// Appends keys or values to a float32 cache: row r of `rows` (token t = r /
/// heads, head h = r % heads) is copied from src + t * src_stride + h * head_dim
/// to row rows[r] of dst, a cache viewed as [rows, head_dim]. The source is
/// the projection's output as it lies (q, k and v side by side in each token's
/// row); ATen's index_copy_ first made it contiguous and then copied each row
/// through its generic indexing (about 70 us a layer at 64 tokens, here a few).
void write_cache_rows(float* dst, const int64_t* rows, int64_t count, const float* src, int64_t src_stride,
                      int64_t heads, int64_t head_dim);

/// One vocabulary row: the tempered distribution softmax(logits / temperature)
/// (temperature <= 0 means 1 for the log-probability and greedy for the pick),
/// optionally truncated to the top_k most likely tokens and then to the
/// smallest prefix whose mass reaches top_p (the token crossing it included),
/// renormalized. `uniform` in [0, 1) picks the token by inverse CDF; the
/// log-probability is under the full tempered distribution. No full sort: the
/// candidates of a truncation are found by selection, growing until they hold
/// the nucleus.
struct row_sample {
  int64_t token = 0;
  float logprob = 0;
};
row_sample sample_row(const float* logits, int64_t vocab, float temperature, bool greedy, int64_t top_k, float top_p,
                      double uniform);

}  // namespace areal::kernels::cpu
