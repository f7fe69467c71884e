// The policy model and its formats: cached decoding equals the full forward,
// Hugging Face checkpoints round-trip bit-exactly, bad files are refused with
// the file and tensor named.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "areal/kernels/device.hpp"
#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/model.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "torch_doctest.hpp"

using namespace areal;
using namespace areal::kernels;
namespace fs = std::filesystem;

namespace {

model_config small_config(const std::string& type, bool tied, int64_t heads, int64_t kv_heads) {
  model_config c;
  c.model_type = type;
  c.attention_bias = type == "qwen2";
  c.vocab_size = 40;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = 128;
  c.rope_theta = 10000;
  c.tie_word_embeddings = tied;
  return c;
}

std::vector<int64_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> out;
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    out.push_back(static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab)));
  }
  return out;
}

struct scratch {
  fs::path path;
  explicit scratch(const std::string& name)
      : path(fs::temp_directory_path() / ("areal-model-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch() { fs::remove_all(path); }
};

// The logits of one full forward over `seqs` packed together; `cu` gets where each starts.
at::Tensor full_logits(policy_model& model, const std::vector<std::vector<int64_t>>& seqs, std::vector<int64_t>& cu) {
  std::vector<int64_t> flat_tokens;
  cu = {0};
  for (auto& s : seqs) {
    flat_tokens.insert(flat_tokens.end(), s.begin(), s.end());
    cu.push_back(cu.back() + static_cast<int64_t>(s.size()));
  }
  return model.logits(model.forward(at::tensor(flat_tokens), cu));
}

// Feeds `seqs` through `cache` in shared steps (sequence s into slot slot_of(s),
// next_count(s, fed) tokens a step, fewer at its end) and returns the largest
// difference of the cached steps' logits from `full` (full_logits, starts `cu`).
double cached_decode_error(policy_model& model, kv_cache& cache, const std::vector<std::vector<int64_t>>& seqs,
                           const at::Tensor& full, const std::vector<int64_t>& cu,
                           const std::function<int64_t(size_t)>& slot_of,
                           const std::function<int64_t(size_t, size_t)>& next_count) {
  std::vector<size_t> fed(seqs.size(), 0);
  std::vector<std::vector<at::Tensor>> cached(seqs.size());
  auto unfinished = [&] {
    for (size_t s = 0; s < seqs.size(); ++s)
      if (fed[s] < seqs[s].size())
        return true;
    return false;
  };
  while (unfinished()) {
    step_input in;
    std::vector<std::pair<size_t, int64_t>> parts;
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (fed[s] == seqs[s].size())
        continue;
      auto count = std::min<int64_t>(next_count(s, fed[s]), static_cast<int64_t>(seqs[s].size() - fed[s]));
      for (int64_t i = 0; i < count; ++i)
        in.tokens.push_back(seqs[s][fed[s] + static_cast<size_t>(i)]);
      in.slots.push_back(slot_of(s));
      in.counts.push_back(count);
      parts.emplace_back(s, count);
      fed[s] += static_cast<size_t>(count);
    }
    auto logits = model.logits(model.forward_cached(cache, in));
    int64_t row = 0;
    for (auto [s, count] : parts) {
      for (int64_t i = 0; i < count; ++i)
        cached[s].push_back(logits[row + i]);
      row += count;
    }
  }
  double worst = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    worst =
        std::max(worst, (at::stack(cached[s]) - full.narrow(0, cu[s], cu[s + 1] - cu[s])).abs().max().item<double>());
  return worst;
}

}  // namespace

TEST_CASE("KV-cached decoding equals the full forward at every position") {
  for (auto [type, tied, heads, kv] : {std::tuple{"qwen2", true, 4, 2}, std::tuple{"qwen2", false, 4, 4},
                                       std::tuple{"llama", false, 4, 1}, std::tuple{"llama", true, 8, 2}}) {
    INFO(type << " tied=" << tied << " heads=" << heads << " kv=" << kv);
    auto config = small_config(type, tied, heads, kv);
    policy_model model(config);
    model.init_random(7, 0.1);
    // Three sequences of different lengths, fed in different chunkings in shared steps.
    std::vector<std::vector<int64_t>> seqs = {random_tokens(23, 40, 1), random_tokens(17, 40, 2),
                                              random_tokens(30, 40, 3)};
    std::vector<std::vector<int64_t>> chunks = {{7}, {1}, {3, 3, 3}};  // then one token at a time
    std::vector<int64_t> cu;
    auto full = full_logits(model, seqs, cu);

    kv_cache cache(config, 4, 64, model.options());
    std::vector<size_t> chunk_index(3, 0);
    auto worst = cached_decode_error(
        model, cache, seqs, full, cu,
        [](size_t s) { return s == 1 ? int64_t{3} : static_cast<int64_t>(s); },  // a gap: slot 2 idle at times
        [&](size_t s, size_t) { return chunk_index[s] < chunks[s].size() ? chunks[s][chunk_index[s]++] : int64_t{1}; });
    CHECK(worst <= 1e-4);
  }
}

TEST_CASE("a CPU cache grows as its sequences do and decodes what a full forward computes") {
  auto config = small_config("qwen2", false, 4, 2);
  config.max_position_embeddings = 1024;
  policy_model model(config);
  model.init_random(11, 0.1);
  // Two slots of unequal lengths, both past the initial room: the slots grow while holding rows.
  int64_t long_len = kv_cache::initial_cpu_rows * 2 + 37, short_len = kv_cache::initial_cpu_rows + 5;
  std::vector<std::vector<int64_t>> seqs = {random_tokens(long_len, 40, 4), random_tokens(short_len, 40, 5)};
  std::vector<int64_t> cu;
  auto full = full_logits(model, seqs, cu);
  for (bool fused_on : {true, false}) {  // the CPU loops, and the ATen path that reads every slot up to the longest
    INFO("fused " << fused_on);
    fused::set_enabled(fused_on);
    kv_cache cache(config, 2, 1024, model.options());
    CHECK(cache.rows() == kv_cache::initial_cpu_rows);
    // A prefill of 20 tokens each, then one token per slot per step.
    auto worst = cached_decode_error(
        model, cache, seqs, full, cu, [](size_t s) { return static_cast<int64_t>(s); },
        [](size_t, size_t fed) { return fed == 0 ? int64_t{20} : int64_t{1}; });
    CHECK(cache.rows() >= long_len);
    CHECK(cache.rows() < cache.max_len());
    CHECK(worst <= 1e-4);
  }
  fused::set_enabled(true);
}

TEST_CASE("a sharded Hugging Face checkpoint round-trips bit-exactly and gives the same logits") {
  scratch dir{"ckpt"};
  auto config = small_config("qwen2", false, 4, 2);
  policy_model model(config);
  model.init_random(3, 0.05);
  model.save(dir.path.string(), 40000);  // small shards: several files and an index
  CHECK(fs::exists(dir.path / "model.safetensors.index.json"));
  int shards = 0;
  for (auto& entry : fs::directory_iterator(dir.path))
    shards += entry.path().extension() == ".safetensors";
  CHECK(shards >= 3);
  CHECK_FALSE(fs::exists(dir.path / "model.safetensors"));
  auto loaded = policy_model::load(dir.path.string());
  CHECK(at::equal(loaded.flat(), model.flat()));
  auto tokens = at::tensor(random_tokens(12, 40, 9));
  CHECK(at::equal(loaded.logits(loaded.forward(tokens, {0, 12})), model.logits(model.forward(tokens, {0, 12}))));
  CHECK(loaded.config().num_key_value_heads == 2);
  CHECK(model.config().parameter_count() == model.flat().numel());
  // Names are the Hugging Face ones.
  auto tensors = read_checkpoint(dir.path.string());
  CHECK(tensors.count("model.layers.1.self_attn.k_proj.bias") == 1);
  CHECK(tensors.count("lm_head.weight") == 1);
}

TEST_CASE("bf16 and f16 weights load into an fp32 model") {
  scratch dir{"bf16"};
  auto config = small_config("llama", true, 4, 2);
  policy_model model(config);
  model.init_random(4, 0.05);
  auto tensors = model.to_tensors();
  for (auto type : {at::kBFloat16, at::kHalf}) {
    tensor_map converted;
    for (auto& [name, t] : tensors) {
      auto values = at::from_blob(const_cast<char*>(t.data.data()), {t.numel()}, at::kFloat).to(type).contiguous();
      stored_tensor c{type == at::kBFloat16 ? dtype::bf16 : dtype::f16, t.shape, {}};
      auto bytes = static_cast<const char*>(values.data_ptr());
      c.data.assign(bytes, bytes + values.numel() * 2);
      converted.emplace(name, std::move(c));
    }
    write_safetensors((dir.path / "model.safetensors").string(), converted);
    std::ofstream(dir.path / "config.json") << to_config_json(config);
    auto loaded = policy_model::load(dir.path.string());
    CHECK((loaded.flat() - model.flat()).abs().max().item<double>() < 1e-3);
  }
}

TEST_CASE("a checkpoint index may name only files beside it") {
  auto shards = parse_checkpoint_index(R"({"weight_map": {"a": "m-1.safetensors", "b": "m-1.safetensors"}})", "i.json");
  CHECK(shards == std::map<std::string, std::vector<std::string>>{{"m-1.safetensors", {"a", "b"}}});
  for (auto bad : {R"("..")", R"(".")", R"("../x.safetensors")", R"("")", R"(3)"})
    CHECK_THROWS_WITH_AS(parse_checkpoint_index(std::string{R"({"weight_map": {"a": )"} + bad + "}}", "i.json"),
                         doctest::Contains("i.json: tensor \"a\" maps to an invalid shard name"), format_error);
  CHECK_THROWS_WITH_AS(parse_checkpoint_index("[1]", "i.json"), doctest::Contains("missing \"weight_map\""),
                       format_error);
}

TEST_CASE("corrupt or mismatched checkpoints are refused naming the file and tensor") {
  scratch dir{"corrupt"};
  auto config = small_config("qwen2", true, 4, 2);
  policy_model model(config);
  model.init_random(5);
  model.save(dir.path.string());
  auto file = (dir.path / "model.safetensors").string();
  auto expect_error = [&](const std::string& part) {
    try {
      policy_model::load(dir.path.string());
      FAIL("loaded a broken checkpoint");
    } catch (const format_error& e) {
      INFO(e.what());
      CHECK(std::string{e.what()}.find(part) != std::string::npos);
    }
  };
  auto original = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  SUBCASE("truncated data") {
    std::ofstream(file, std::ios::binary) << original.substr(0, original.size() - 100);
    expect_error("lie outside");
  }
  SUBCASE("header length beyond the file") {
    auto bad = original;
    bad[6] = 0x7f;
    std::ofstream(file, std::ios::binary) << bad;
    expect_error("header length");
  }
  SUBCASE("unknown dtype") {
    auto bad = original;
    auto at = bad.find("\"F32\"");
    bad.replace(at, 5, "\"F99\"");
    std::ofstream(file, std::ios::binary) << bad;
    expect_error("unknown dtype \"F99\"");
  }
  SUBCASE("wrong shape for the config") {
    auto c = config;
    c.intermediate_size = 128;
    std::ofstream(dir.path / "config.json") << to_config_json(c);
    expect_error("tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [96, 64], the config needs [128, 64]");
  }
  SUBCASE("missing tensor") {
    auto tensors = read_safetensors(file);
    tensors.erase("model.norm.weight");
    write_safetensors(file, tensors);
    expect_error("tensor \"model.norm.weight\" is missing");
  }
  SUBCASE("unexpected tensor") {
    auto tensors = read_safetensors(file);
    tensors["model.layers.9.extra.weight"] = tensors["model.norm.weight"];
    write_safetensors(file, tensors);
    expect_error("unexpected tensor \"model.layers.9.extra.weight\"");
  }
  SUBCASE("bad config") {
    std::ofstream(dir.path / "config.json") << "{\"model_type\": \"qwen2\", \"vocab_size\": 40}";
    expect_error("missing key \"hidden_size\"");
  }
  SUBCASE("a config asking for an unsupported feature") {
    std::ofstream(dir.path / "config.json") << R"({"model_type": "qwen2", "vocab_size": 40, "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "rope_scaling": {"type": "yarn"}})";
    expect_error("rope_scaling");
  }
  SUBCASE("not a safetensors file at all") {
    std::ofstream(file, std::ios::binary) << "hello";
    expect_error("too short");
  }
  SUBCASE("two tensors sharing bytes") {
    // model.norm.weight made to point into the bytes of the first tensor of the data section.
    auto bad = original;
    auto at = bad.find("\"model.norm.weight\"");
    auto offsets = bad.find("\"data_offsets\":[", at) + 16;
    auto close = bad.find(']', offsets);
    auto begin_end = bad.substr(offsets, close - offsets);
    auto width = std::stoll(begin_end.substr(begin_end.find(',') + 1)) - std::stoll(begin_end);
    auto replacement = "0," + std::to_string(width);
    replacement.resize(begin_end.size(), ' ');  // JSON whitespace keeps the header's length
    bad.replace(offsets, begin_end.size(), replacement);
    std::ofstream(file, std::ios::binary) << bad;
    expect_error("overlap in the data section");
  }
  SUBCASE("weights holding NaN") {
    auto tensors = read_safetensors(file);
    auto& norm = tensors["model.norm.weight"];
    auto nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(norm.data.data(), &nan, sizeof nan);
    write_safetensors(file, tensors);
    expect_error("tensor \"model.norm.weight\" holds NaN or infinite values");
  }
  SUBCASE("a config.json key of the wrong type") {
    std::ofstream(dir.path / "config.json") << R"({"model_type": "qwen2", "vocab_size": 40, "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "tie_word_embeddings": "yes"})";
    expect_error("key \"tie_word_embeddings\" must be true or false, not \"yes\"");
  }
}

TEST_CASE("a model directory with config and shards and tokenizer loads and runs") {
  scratch dir{"full"};
  auto tok = tokenizer::character_level("0123456789+-*/= ", {"<unk>", "<eos>"});
  auto config = small_config("qwen2", true, 4, 2);
  config.vocab_size = tok.vocab_size();
  policy_model model(config);
  model.init_random(8, 0.05);
  model.save(dir.path.string(), 30000);
  tok.save((dir.path / "tokenizer.json").string());
  auto loaded_model = policy_model::load(dir.path.string());
  auto loaded_tok = tokenizer::load((dir.path / "tokenizer.json").string());
  auto ids = loaded_tok.encode("12+34=46");
  std::vector<int64_t> tokens(ids.begin(), ids.end());
  auto n = static_cast<int64_t>(tokens.size());
  CHECK(at::equal(loaded_model.logits(loaded_model.forward(at::tensor(tokens), {0, n})),
                  model.logits(model.forward(at::tensor(tokens), {0, n}))));
}

TEST_CASE("device and dtype come from configuration and CUDA is refused clearly without it") {
  auto cpu = tensor_options("cpu", "float32");
  CHECK(cpu.device().is_cpu());
  CHECK(tensor_options("cpu", "bfloat16").dtype() == at::kBFloat16);
  if (!at::hasCUDA()) {
    CHECK_THROWS_WITH_AS(tensor_options("cuda", "bfloat16"), doctest::Contains("this LibTorch build has no CUDA"),
                         format_error);
  }
  CHECK_THROWS_WITH_AS(tensor_options("tpu", "float32"), doctest::Contains("use cpu or cuda"), format_error);
  CHECK_THROWS_WITH_AS(tensor_options("cpu", "int8"), doctest::Contains("use float32, bfloat16 or float16"),
                       format_error);
  // A bfloat16 model: the cached path still agrees with the full forward, to bfloat16 precision.
  auto config = small_config("qwen2", true, 4, 2);
  policy_model model(config, tensor_options("cpu", "bfloat16"));
  model.init_random(9, 0.1);
  auto tokens = random_tokens(10, 40, 4);
  auto full = model.logits(model.forward(at::tensor(tokens), {0, 10})).to(at::kFloat);
  kv_cache cache(config, 1, 32, model.options());
  auto first =
      model.logits(model.forward_cached(cache, {std::vector<int64_t>(tokens.begin(), tokens.begin() + 6), {0}, {6}}));
  std::vector<at::Tensor> rows = {first};
  for (int i = 6; i < 10; ++i)
    rows.push_back(model.logits(model.forward_cached(cache, {{tokens[static_cast<size_t>(i)]}, {0}, {1}})));
  auto cached = at::cat(rows, 0).to(at::kFloat);
  CHECK((cached - full).abs().max().item<double>() < 0.05);
}

TEST_CASE("presets have the advertised sizes") {
  auto tiny = preset("tiny", 64).parameter_count();
  auto small = preset("small", 64).parameter_count();
  CHECK(tiny > 1'000'000);
  CHECK(tiny < 5'000'000);
  CHECK(small > 20'000'000);
  CHECK(small < 30'000'000);
  // Qwen2-0.5B at its own vocabulary: 494 M (its model card's 0.49 B).
  auto qwen = preset("qwen2-0.5b", 151936).parameter_count();
  CHECK(qwen > 490'000'000);
  CHECK(qwen < 500'000'000);
  CHECK_THROWS_AS(preset("huge", 64), format_error);
}

namespace {

// Logits, and the gradient of a weighted sum of them over every parameter, of
// packed sequences of different lengths (lengths 1 and 2 included: masks of
// every shape).
std::pair<at::Tensor, at::Tensor> logits_and_gradient(policy_model& model, const std::vector<int64_t>& lengths) {
  std::vector<int64_t> tokens, cu{0};
  for (size_t s = 0; s < lengths.size(); ++s) {
    auto t = random_tokens(lengths[s], 40, 11 + s);
    tokens.insert(tokens.end(), t.begin(), t.end());
    cu.push_back(cu.back() + lengths[s]);
  }
  model.set_trainable(true);
  model.flat_grad().zero_();
  auto logits = model.logits(model.forward(at::tensor(tokens), cu));
  auto weights = at::sin(at::arange(logits.numel(), logits.options()).view(logits.sizes()));
  (logits * weights).sum().backward();
  auto grad = model.flat_grad().clone();
  model.set_trainable(false);
  return {logits.detach().to(at::kDouble), grad.to(at::kDouble)};
}

double relative(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

}  // namespace

TEST_CASE("the fused float32 layers give the float64 model's logits and gradients, as ATen's float32 layers do") {
  for (auto [type, heads, kv] : {std::tuple{"qwen2", 4, 2}, std::tuple{"llama", 4, 1}}) {
    INFO(type);
    auto config = small_config(type, false, heads, kv);
    policy_model fused_model(config), reference(config, at::TensorOptions().dtype(at::kDouble));
    fused_model.init_random(3, 0.1);
    reference.flat().copy_(fused_model.flat());
    std::vector<int64_t> lengths = {23, 1, 9, 2, 30};
    auto [want_logits, want_grad] = logits_and_gradient(reference, lengths);
    kernels::fused::set_enabled(false);
    auto [aten_logits, aten_grad] = logits_and_gradient(fused_model, lengths);
    kernels::fused::set_enabled(true);
    auto [logits, grad] = logits_and_gradient(fused_model, lengths);
    double aten_error = relative(aten_grad, want_grad);
    CHECK(relative(aten_logits, want_logits) <= 1e-5);
    CHECK(relative(logits, want_logits) <= 1e-5);
    CHECK(aten_error <= 1e-5);
    CHECK(relative(grad, want_grad) <= std::max(1e-5, 2 * aten_error));
  }
}
