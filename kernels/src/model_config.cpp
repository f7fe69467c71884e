#include "areal/kernels/model_config.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace areal::kernels {

int64_t model_config::parameter_count() const {
  auto h = hidden_size, d = head_dim(), kv = num_key_value_heads * d, q = num_attention_heads * d;
  int64_t attention = h * q + 2 * h * kv + q * h + (attention_bias ? q + 2 * kv : 0);
  int64_t mlp = 3 * h * intermediate_size;
  int64_t layer = attention + mlp + 2 * h;
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + h;
}

void model_config::validate(const std::string& source) const {
  auto fail = [&](const std::string& what) { throw format_error(source + ": " + what); };
  if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_hidden_layers <= 0 ||
      num_attention_heads <= 0 || num_key_value_heads <= 0 || max_position_embeddings <= 0)
    fail(
        "vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
        "num_key_value_heads and max_position_embeddings must all be positive");
  if (hidden_size % num_attention_heads != 0)
    fail("hidden_size " + std::to_string(hidden_size) + " is not a multiple of num_attention_heads " +
         std::to_string(num_attention_heads));
  if (num_attention_heads % num_key_value_heads != 0)
    fail("num_attention_heads " + std::to_string(num_attention_heads) + " is not a multiple of num_key_value_heads " +
         std::to_string(num_key_value_heads) + " (grouped-query attention needs whole groups)");
  if (head_dim() % 2 != 0)
    fail("head dimension " + std::to_string(head_dim()) + " must be even for rotary embeddings");
  if (!(rms_norm_eps > 0) || !(rope_theta > 0))
    fail("rms_norm_eps and rope_theta must be positive");
}

model_config parse_model_config(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw format_error(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object())
    throw format_error(source + ": expected a JSON object");
  model_config c;
  auto get_int = [&](const char* key, int64_t& out, bool required) {
    if (!j.contains(key)) {
      if (required)
        throw format_error(source + ": missing key \"" + key + "\"");
      return;
    }
    if (!j[key].is_number_integer())
      throw format_error(source + ": key \"" + key + "\" must be an integer");
    out = j[key].get<int64_t>();
  };
  auto get_number = [&](const char* key, double& out) {
    if (j.contains(key)) {
      if (!j[key].is_number())
        throw format_error(source + ": key \"" + key + "\" must be a number");
      out = j[key].get<double>();
    }
  };
  auto get_bool = [&](const char* key, bool fallback) {
    if (!j.contains(key) || j[key].is_null())
      return fallback;
    if (!j[key].is_boolean())
      throw format_error(source + ": key \"" + key + "\" must be true or false, not " + j[key].dump());
    return j[key].get<bool>();
  };
  if (j.contains("model_type")) {
    if (!j["model_type"].is_string())
      throw format_error(source + ": key \"model_type\" must be a string, not " + j["model_type"].dump());
    c.model_type = j["model_type"].get<std::string>();
  }
  if (c.model_type != "qwen2" && c.model_type != "llama")
    throw format_error(source + ": model_type \"" + c.model_type + "\" is not supported; use qwen2 or llama");
  get_int("vocab_size", c.vocab_size, true);
  get_int("hidden_size", c.hidden_size, true);
  get_int("intermediate_size", c.intermediate_size, true);
  get_int("num_hidden_layers", c.num_hidden_layers, true);
  get_int("num_attention_heads", c.num_attention_heads, true);
  c.num_key_value_heads = c.num_attention_heads;
  get_int("num_key_value_heads", c.num_key_value_heads, false);
  get_int("max_position_embeddings", c.max_position_embeddings, false);
  get_number("rms_norm_eps", c.rms_norm_eps);
  get_number("rope_theta", c.rope_theta);
  c.tie_word_embeddings = get_bool("tie_word_embeddings", c.tie_word_embeddings);
  // Qwen2 always has QKV biases; Llama says so with attention_bias.
  c.attention_bias = c.model_type == "qwen2" ? true : get_bool("attention_bias", false);
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer())
    c.bos_token_id = j["bos_token_id"].get<int64_t>();
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer())
    c.eos_token_id = j["eos_token_id"].get<int64_t>();
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw format_error(source + ": rope_scaling " + j["rope_scaling"].dump() +
                       " is not supported; only plain rotary embeddings");
  if (get_bool("use_sliding_window", false))
    throw format_error(source + ": use_sliding_window = true is not supported; attention is always full causal");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    throw format_error(source + ": hidden_act " + j["hidden_act"].dump() + " is not supported; only silu (SwiGLU)");
  c.validate(source);
  return c;
}

model_config load_model_config(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw format_error(path + ": cannot open; a model directory needs a config.json");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), path);
}

std::string to_config_json(const model_config& c) {
  nlohmann::json j;
  j["architectures"] = {c.model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "float32";
  if (c.model_type == "llama")
    j["attention_bias"] = c.attention_bias;
  if (c.bos_token_id >= 0)
    j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0)
    j["eos_token_id"] = c.eos_token_id;
  return j.dump(2) + "\n";
}

model_config preset(const std::string& name, int64_t vocab_size) {
  model_config c;
  c.vocab_size = vocab_size;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = true;
  if (name == "micro") {
    c.hidden_size = 64;
    c.intermediate_size = 176;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
  } else if (name == "tiny") {
    c.hidden_size = 256;
    c.intermediate_size = 704;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
  } else if (name == "small") {
    c.hidden_size = 512;
    c.intermediate_size = 1408;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
  } else if (name == "qwen2-0.5b") {
    // Qwen2-0.5B's shape (its config.json): a GPU-sized model, with the vocabulary given.
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 14;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 4096;
    c.rope_theta = 1000000.0;
  } else {
    throw format_error("unknown model preset \"" + name + "\"; use micro, tiny, small or qwen2-0.5b");
  }
  c.validate("preset " + name);
  return c;
}

}  // namespace areal::kernels
