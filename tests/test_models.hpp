// The small model shape most tests use (2 layers, hidden 32, grouped-query
// attention 4/2, tied head): big enough to exercise every code path, small
// enough to run in milliseconds.
#pragma once

#include "areal/kernels/model_config.hpp"

namespace areal::test {

inline kernels::model_config small_model_config(int64_t vocab_size, int64_t max_positions = 128) {
  kernels::model_config c;
  c.vocab_size = vocab_size;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = max_positions;
  c.tie_word_embeddings = true;
  return c;
}

}  // namespace areal::test
