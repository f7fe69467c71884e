// The shape of a Qwen2/Llama-family decoder, as in a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace areal::kernels {

/// Raised for unreadable or inconsistent model files; the text names the file
/// (and the tensor or key) and says what to do.
struct format_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct model_config {
  std::string model_type = "qwen2";  // "qwen2" (QKV bias) or "llama" (attention_bias key)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool attention_bias = true;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  /// Not part of config.json: the run's model.dtype. "float32", or "bfloat16":
  /// matrix products in bfloat16, parameters and everything else in float32.
  std::string compute_dtype = "float32";

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// Number of parameters (the LM head counted once when tied).
  int64_t parameter_count() const;
  /// Throws format_error when the numbers do not describe a valid model.
  void validate(const std::string& source) const;
};

/// Parses config.json text (`source` names it in errors).
model_config parse_model_config(const std::string& json_text, const std::string& source);
model_config load_model_config(const std::string& path);
/// The config.json text of a configuration.
std::string to_config_json(const model_config& c);

/// Presets for CPU work: "micro" (about 0.1 M parameters, for tests), "tiny"
/// (about 3 M) and "small" (about 25 M); for GPUs, "qwen2-0.5b" (Qwen2-0.5B's
/// shape: about 360 M parameters besides the embedding, 494 M at its own vocabulary of 151,936).
model_config preset(const std::string& name, int64_t vocab_size);

}  // namespace areal::kernels
