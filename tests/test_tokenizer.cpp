// Tokenizers: known encodings for a hand-built byte-level BPE, round trips of
// multilingual text, raw bytes and special tokens, the character-level
// tokenizer, and refusal of broken tokenizer.json files.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "areal/kernels/model_config.hpp"
#include "areal/kernels/tokenizer.hpp"

using namespace areal::kernels;

namespace {

// Qwen2's pre-tokenizer split pattern, as its tokenizer.json states it.
const char* qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's printable stand-in for every byte, in byte order.
std::vector<std::string> byte_chars() {
  std::vector<std::string> out;
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xc0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    }
    return s;
  };
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    bool direct = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    out.push_back(utf8(direct ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++)));
  }
  return out;
}

// A byte-level BPE: all 256 byte characters, a few merges, two special tokens.
std::string hand_built_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  auto chars = byte_chars();
  for (int i = 0; i < 256; ++i)
    vocab[chars[static_cast<size_t>(i)]] = i;
  std::vector<std::pair<std::string, std::string>> merges = {{"a", "b"},
                                                             {"ab", "c"},
                                                             {"\xc4\xa0", "a"},
                                                             {"\xc4\xa0"
                                                              "a",
                                                              "b"},
                                                             {"l", "o"},
                                                             {"lo", "w"}};
  int id = 256;
  nlohmann::json merge_list = nlohmann::json::array();
  for (auto& [a, b] : merges) {
    vocab[a + b] = id++;
    merge_list.push_back(a + " " + b);
  }
  nlohmann::json j;
  j["added_tokens"] = {{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}},
                       {{"id", 301}, {"content", "<|im_start|>"}, {"special", true}}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", qwen2_pattern}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}};
  return j.dump();
}

}  // namespace

TEST_CASE("known encodings of a hand-built byte-level BPE") {
  auto t = tokenizer::from_json(hand_built_tokenizer(), "hand.json");
  CHECK(t.byte_level());
  auto abc = *t.token_id("abc");
  auto space_ab = *t.token_id(
      "\xc4\xa0"
      "ab");
  auto low = *t.token_id("low");
  CHECK(t.encode("abc") == std::vector<int32_t>{abc});
  // Merges apply by rank: in " ab" the pair (a, b) outranks (space, a), so no "space-ab" token forms.
  CHECK(t.encode("abc ab") == std::vector<int32_t>{abc, ' ', *t.token_id("ab")});
  CHECK(t.encode(" a") == std::vector<int32_t>{*t.token_id("\xc4\xa0"
                                                           "a")});
  CHECK(space_ab == 259);
  CHECK(t.encode("lower") == std::vector<int32_t>{low, 'e', 'r'});  // bytes without merges stay single
  CHECK(t.encode("ab1") == std::vector<int32_t>{*t.token_id("ab"), '1'});
  // Numbers split digit by digit with Qwen2's pattern.
  CHECK(t.encode("123") == std::vector<int32_t>{'1', '2', '3'});
  // Special tokens are matched first and never merged.
  CHECK(t.encode("<|im_start|>abc<|endoftext|>") == std::vector<int32_t>{301, abc, 300});
  CHECK(t.decode({301, abc, 300}) == "<|im_start|>abc<|endoftext|>");
  CHECK(t.decode({301, abc, 300}, true) == "abc");
}

TEST_CASE("byte-level round trips of multilingual text and raw bytes") {
  auto t = tokenizer::from_json(hand_built_tokenizer(), "hand.json");
  for (std::string text :
       {std::string{"Hello, world! It's 42."},
        std::string{"\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82"},
        std::string{"caf\xc3\xa9 \xf0\x9f\x99\x82 \xc2\xbd\n\n\tend  "}, std::string{"\xff\xfe raw \x80 bytes"},
        std::string{"<|im_start|>user\nlow abc<|endoftext|>"}, std::string{}}) {
    auto ids = t.encode(text);
    CHECK(t.decode(ids) == text);
  }
}

TEST_CASE("a tokenizer survives save and load") {
  auto t = tokenizer::from_json(hand_built_tokenizer(), "hand.json");
  auto again = tokenizer::from_json(t.to_json(), "again.json");
  std::string text = "abc lower <|endoftext|> \xe4\xb8\x96";
  CHECK(again.encode(text) == t.encode(text));
  CHECK(again.vocab_size() == t.vocab_size());
}

TEST_CASE("the character-level tokenizer encodes one id per character") {
  auto t = tokenizer::character_level("0123456789+-*/=() abc\xc3\xa9", {"<unk>", "<eos>"});
  auto ids = t.encode("12+3=15<eos>");
  CHECK(ids.size() == 8);
  CHECK(ids.back() == 1);
  CHECK(t.decode(ids) == "12+3=15<eos>");
  CHECK(t.encode("\xc3\xa9")[0] == *t.token_id("\xc3\xa9"));
  CHECK(t.encode("Z") == std::vector<int32_t>{0});  // unknown character -> <unk>
  auto path = std::filesystem::temp_directory_path() / ("areal-tok-" + std::to_string(::getpid()) + ".json");
  t.save(path.string());
  auto loaded = tokenizer::load(path.string());
  std::filesystem::remove(path);
  CHECK_FALSE(loaded.byte_level());
  CHECK(loaded.encode("12+3=15<eos>") == ids);
  CHECK(loaded.decode(ids) == "12+3=15<eos>");
}

TEST_CASE("broken tokenizer files are refused naming the file") {
  auto expect = [](const std::string& json, const std::string& part) {
    try {
      tokenizer::from_json(json, "tok.json");
      FAIL("accepted a broken tokenizer");
    } catch (const format_error& e) {
      INFO(std::string{e.what()});
      CHECK(std::string{e.what()}.find("tok.json: " + part) != std::string::npos);
    }
  };
  expect("{", "not valid JSON");
  expect("{}", "no \"model\" object");
  expect(R"({"model": {"type": "Unigram"}})", "model type \"Unigram\" is not supported");
  expect(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]}})", "merge \"a a\" makes a token");
  expect(R"({"model": {"type": "BPE", "vocab": {"a": -3}}})", "vocab entry \"a\" has an invalid id");
  expect(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}}})",
      "pre-tokenizer pattern does not compile");
  // Found by fuzzing (tests/fuzz/corpus/tokenizer/regression_*): an added token's
  // id was used unchecked as an index, and wrongly typed fields escaped as JSON errors.
  expect(R"({"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": -5, "content": "<x>"}]})",
         "added token \"<x>\" has an invalid id -5");
  expect(R"({"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 1e30, "content": "<x>"}]})",
         "added token \"<x>\" has an invalid id");
  expect(R"({"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": "1", "content": "<x>"}]})",
         "added token \"<x>\" has an invalid id \"1\"");
  expect(R"({"model": {"type": 7, "vocab": {"a": 0}}})", "model type 7 is not supported");
  expect(R"({"model": {"vocab": {"a": 0}}, "pre_tokenizer": {"type": "ByteLevel", "use_regex": "yes"}})",
         "not a valid tokenizer.json");
  CHECK_THROWS_AS(tokenizer::load("/nonexistent/tokenizer.json"), format_error);
}
