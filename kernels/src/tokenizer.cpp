#include "areal/kernels/tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "areal/kernels/model_config.hpp"
#include "areal/runtime/files.hpp"

namespace areal::kernels {

namespace {

// GPT-2's pre-tokenizer pattern (used by a ByteLevel pre-tokenizer with use_regex).
constexpr const char* gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return out;
}

// Splits UTF-8 text into characters; an invalid byte is a character of its own.
std::vector<std::string> characters(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size())
      n = 1;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80)
        n = 1;
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// GPT-2's reversible map from bytes to printable characters.
struct byte_map {
  std::string to_char[256];
  std::unordered_map<std::string, unsigned char> to_byte;
  byte_map() {
    std::vector<int> printable;
    for (int b = '!'; b <= '~'; ++b)
      printable.push_back(b);
    for (int b = 0xa1; b <= 0xac; ++b)
      printable.push_back(b);
    for (int b = 0xae; b <= 0xff; ++b)
      printable.push_back(b);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      bool direct = std::find(printable.begin(), printable.end(), b) != printable.end();
      to_char[b] = utf8(direct ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++));
      to_byte[to_char[b]] = static_cast<unsigned char>(b);
    }
  }
};

const byte_map& bytes() {
  static const byte_map map;
  return map;
}

std::string merge_key(const std::string& a, const std::string& b) {
  return a + '\x1f' + b;
}

// Finds the Split regex and the ByteLevel settings anywhere in a pre-tokenizer tree.
void scan_pre_tokenizer(const nlohmann::json& node, std::string& pattern, bool& byte_level, bool& byte_level_regex,
                        int depth = 0) {
  if (!node.is_object())
    return;
  if (depth > 8)
    throw format_error("pre-tokenizer Sequences nest deeper than 8");
  auto type = node.value("type", "");
  if (type == "Sequence" && node.contains("pretokenizers"))
    for (auto& child : node["pretokenizers"])
      scan_pre_tokenizer(child, pattern, byte_level, byte_level_regex, depth + 1);
  if (type == "Split" && node.contains("pattern") && node["pattern"].contains("Regex"))
    pattern = node["pattern"]["Regex"].get<std::string>();
  if (type == "ByteLevel") {
    byte_level = true;
    byte_level_regex = node.value("use_regex", true);
  }
}

// Token ids a tokenizer.json may use: the largest vocabularies in use have ~256k.
constexpr int64_t max_token_id = int64_t{1} << 24;

bool valid_id(const nlohmann::json& id) {
  return id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= max_token_id;
}

}  // namespace

struct tokenizer::regex {
  pcre2_code* code = nullptr;
  ~regex() {
    if (code)
      pcre2_code_free(code);
  }
};

tokenizer::tokenizer() = default;
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

void tokenizer::finish_setup(const std::string& source) {
  id_to_token_.clear();
  int32_t max_id = -1;
  for (auto& [t, id] : vocab_)
    max_id = std::max(max_id, id);
  for (auto& a : added_)
    max_id = std::max(max_id, a.id);
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string{});
  for (auto& [t, id] : vocab_)
    id_to_token_[static_cast<size_t>(id)] = t;
  for (auto& a : added_)
    id_to_token_[static_cast<size_t>(a.id)] = a.content;
  std::sort(added_.begin(), added_.end(), [](auto& x, auto& y) { return x.content.size() > y.content.size(); });
  merge_rank_.clear();
  for (size_t i = 0; i < merges_.size(); ++i) {
    auto& [a, b] = merges_[i];
    if (!vocab_.count(a + b))
      throw format_error(source + ": merge \"" + a + " " + b + "\" makes a token that is not in the vocabulary");
    merge_rank_.emplace(merge_key(a, b), static_cast<int32_t>(i));
  }
  if (!unk_token_.empty()) {
    auto it = vocab_.find(unk_token_);
    if (it == vocab_.end())
      throw format_error(source + ": unk_token \"" + unk_token_ + "\" is not in the vocabulary");
    unk_id_ = it->second;
  }
  regex_.reset();
  if (!split_pattern_.empty()) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(split_pattern_.c_str()), split_pattern_.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      throw format_error(source + ": pre-tokenizer pattern does not compile at offset " + std::to_string(offset) +
                         ": " + reinterpret_cast<char*>(message));
    }
    regex_ = std::make_unique<regex>();
    regex_->code = code;
  }
}

tokenizer tokenizer::from_json(const std::string& text, const std::string& source) {
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw format_error(source + ": not valid JSON: " + e.what());
  }
  // Wrongly typed fields throw from inside; each is reported as a format_error below.
  auto read_fields = [&]() -> tokenizer {
    const nlohmann::json& j = parsed;  // read only: a missing key is never inserted
    if (!j.contains("model") || !j["model"].is_object())
      throw format_error(source + ": no \"model\" object: not a tokenizer.json");
    auto& model = j["model"];
    auto type = model.contains("type") ? model["type"] : nlohmann::json("BPE");
    if (type != "BPE")
      throw format_error(source + ": model type " + type.dump() + " is not supported; only BPE");
    if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>())
      throw format_error(source + ": byte_fallback BPE is not supported");
    tokenizer t;
    if (!model.contains("vocab") || !model["vocab"].is_object())
      throw format_error(source + ": model.vocab must be an object of token -> id");
    for (auto& [token, id] : model["vocab"].items()) {
      if (!valid_id(id))
        throw format_error(source + ": vocab entry \"" + token + "\" has an invalid id " + id.dump() +
                           " (ids are integers in [0, " + std::to_string(max_token_id) + "])");
      t.vocab_[token] = id.get<int32_t>();
    }
    if (model.contains("merges") && model["merges"].is_array()) {
      for (auto& m : model["merges"]) {
        if (m.is_string()) {
          auto s = m.get<std::string>();
          auto space = s.find(' ', 1);
          if (space == std::string::npos)
            throw format_error(source + ": merge \"" + s + "\" is not \"left right\"");
          t.merges_.emplace_back(s.substr(0, space), s.substr(space + 1));
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
          t.merges_.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        } else {
          throw format_error(source + ": a merge must be \"left right\" or [left, right]");
        }
      }
    }
    if (model.contains("unk_token") && model["unk_token"].is_string())
      t.unk_token_ = model["unk_token"].get<std::string>();
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (auto& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string())
          throw format_error(source + ": an added token needs an id and a content string");
        if (!valid_id(a["id"]))
          throw format_error(source + ": added token \"" + a["content"].get<std::string>() + "\" has an invalid id " +
                             a["id"].dump() + " (ids are integers in [0, " + std::to_string(max_token_id) + "])");
        auto special = a.contains("special") && a["special"].is_boolean() && a["special"].get<bool>();
        t.added_.push_back({a["id"].get<int32_t>(), a["content"].get<std::string>(), special});
      }
    bool byte_level = false, byte_level_regex = false;
    std::string pattern;
    if (j.contains("pre_tokenizer"))
      scan_pre_tokenizer(j["pre_tokenizer"], pattern, byte_level, byte_level_regex);
    if (j.contains("decoder") && j["decoder"].is_object() && j["decoder"].value("type", "") == "ByteLevel")
      byte_level = true;
    if (pattern.empty() && byte_level && byte_level_regex)
      pattern = gpt2_pattern;
    t.byte_level_ = byte_level;
    t.split_pattern_ = pattern;
    t.finish_setup(source);
    return t;
  };
  try {
    return read_fields();
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    throw format_error(source + ": not a valid tokenizer.json: " + e.what());
  } catch (const format_error& e) {
    std::string what = e.what();
    throw what.rfind(source, 0) == 0 ? e : format_error(source + ": " + what);
  }
}

tokenizer tokenizer::load(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw format_error(path + ": cannot open; a model directory needs a tokenizer.json");
  std::ostringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path);
}

tokenizer tokenizer::character_level(std::string_view alphabet, const std::vector<std::string>& special_tokens) {
  tokenizer t;
  int32_t next = 0;
  for (auto& s : special_tokens)
    t.added_.push_back({next++, s, true});
  for (auto& c : characters(alphabet))
    if (!t.vocab_.count(c))
      t.vocab_[c] = next++;
  if (!special_tokens.empty()) {
    t.unk_token_ = special_tokens.front();
    t.vocab_[t.unk_token_] = 0;
  }
  t.finish_setup("character-level tokenizer");
  return t;
}

std::string tokenizer::to_json() const {
  nlohmann::json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = nlohmann::json::array();
  auto added = added_;
  std::sort(added.begin(), added.end(), [](auto& a, auto& b) { return a.id < b.id; });
  for (auto& a : added)
    j["added_tokens"].push_back({{"id", a.id},
                                 {"content", a.content},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", a.special}});
  j["normalizer"] = nullptr;
  if (byte_level_) {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", split_pattern_}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  } else {
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = nullptr;
  }
  j["post_processor"] = nullptr;
  nlohmann::json vocab = nlohmann::json::object();
  for (auto& [token, id] : vocab_)
    vocab[token] = id;
  nlohmann::json merges = nlohmann::json::array();
  for (auto& [a, b] : merges_)
    merges.push_back({a, b});
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", unk_token_.empty() ? nlohmann::json() : nlohmann::json(unk_token_)},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", merges}};
  return j.dump(2) + "\n";
}

void tokenizer::save(const std::string& path) const {
  try {
    write_file_atomically(path, to_json());
  } catch (const file_error& e) {
    throw format_error(e.what());
  }
}

std::optional<int32_t> tokenizer::token_id(std::string_view token) const {
  auto it = vocab_.find(std::string{token});
  if (it != vocab_.end())
    return it->second;
  for (auto& a : added_)
    if (a.content == token)
      return a.id;
  return std::nullopt;
}

std::vector<std::string> tokenizer::split(std::string_view text) const {
  std::vector<std::string> pieces;
  if (!regex_) {
    pieces.emplace_back(text);
    return pieces;
  }
  auto data = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  PCRE2_SIZE start = 0, gap = 0;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (start <= text.size()) {
    int rc = pcre2_match(regex_->code, subject, text.size(), start, 0, data, nullptr);
    if (rc < 0)
      break;
    auto ovector = pcre2_get_ovector_pointer(data);
    auto begin = ovector[0], end = ovector[1];
    if (begin > gap)
      pieces.emplace_back(text.substr(gap, begin - gap));  // an unmatched stretch is a piece too
    if (end > begin)
      pieces.emplace_back(text.substr(begin, end - begin));
    gap = end;
    if (end == begin) {  // empty match: step over one character
      if (end >= text.size())
        break;
      start = end + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80)
        ++start;
    } else {
      start = end;
    }
  }
  if (gap < text.size())
    pieces.emplace_back(text.substr(gap));
  pcre2_match_data_free(data);
  return pieces;
}

void tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<std::string> symbols;
  if (byte_level_) {
    for (unsigned char b : piece)
      symbols.push_back(bytes().to_char[b]);
  } else {
    symbols = characters(piece);
  }
  // Merge the adjacent pair of lowest rank until none is mergeable.
  while (symbols.size() > 1 && !merge_rank_.empty()) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank_.find(merge_key(symbols[i], symbols[i + 1]));
      if (it != merge_rank_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == INT32_MAX)
      break;
    symbols[at] += symbols[at + 1];
    symbols.erase(symbols.begin() + static_cast<long>(at) + 1);
  }
  for (auto& s : symbols) {
    auto it = vocab_.find(s);
    if (it != vocab_.end())
      out.push_back(it->second);
    else if (unk_id_)
      out.push_back(*unk_id_);
    else
      throw std::invalid_argument("cannot encode \"" + s + "\": not in the vocabulary and there is no unk_token");
  }
}

std::vector<int32_t> tokenizer::encode(std::string_view text, bool match_special) const {
  std::vector<int32_t> out;
  size_t plain_start = 0, i = 0;
  auto flush = [&](size_t end) {
    if (end > plain_start)
      for (auto& piece : split(text.substr(plain_start, end - plain_start)))
        encode_piece(piece, out);
  };
  while (i < text.size()) {
    const added_token* hit = nullptr;
    for (auto& a : added_)
      if (!a.content.empty() && (match_special || !a.special) && text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;  // longest first
      }
    if (!hit) {
      ++i;
      continue;
    }
    flush(i);
    out.push_back(hit->id);
    i += hit->content.size();
    plain_start = i;
  }
  flush(text.size());
  return out;
}

std::string tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (auto id : ids) {
    if (id < 0)
      throw std::invalid_argument("token id " + std::to_string(id) + " is negative");
    if (id >= vocab_size()) {
      // A model's vocabulary may be padded past its tokenizer's: such an id has no text.
      out += "\xEF\xBF\xBD";  // U+FFFD
      continue;
    }
    auto special = std::find_if(added_.begin(), added_.end(), [&](auto& a) { return a.id == id; });
    if (special != added_.end()) {
      if (!(skip_special && special->special))
        out += special->content;
      continue;
    }
    auto& token = id_to_token_[static_cast<size_t>(id)];
    if (!byte_level_) {
      out += token;
      continue;
    }
    for (auto& c : characters(token)) {
      auto it = bytes().to_byte.find(c);
      out += it != bytes().to_byte.end() ? static_cast<char>(it->second) : '?';
    }
  }
  return out;
}

}  // namespace areal::kernels
