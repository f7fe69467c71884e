// Tokenizers in the Hugging Face tokenizer.json layout.
//
// One implementation covers both kinds the project uses:
//   - byte-level BPE (GPT-2 / Qwen2): text is split by the pre-tokenizer's regular
//     expression (PCRE2 with Unicode properties), each piece's bytes are mapped
//     to printable characters, and the BPE merges are applied by rank;
//   - character level, for the tiny synthetic-task presets: a BPE model with no
//     merges whose vocabulary is single characters, saved in the same layout.
// Added tokens (specials such as <|endoftext|>) are matched in the text first.
// Not implemented: Unicode normalizers (input is taken as already NFC), BPE
// dropout, byte fallback; a tokenizer.json asking for them loads with them ignored
// only where that cannot change the result, and is refused otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace areal::kernels {

class tokenizer {
 public:
  /// Loads tokenizer.json; format_error names the file and what is wrong.
  static tokenizer load(const std::string& path);
  static tokenizer from_json(const std::string& json_text, const std::string& source);
  /// A character-level tokenizer over the characters of `alphabet` (UTF-8),
  /// plus `special_tokens` (the first is also the unknown token).
  static tokenizer character_level(std::string_view alphabet, const std::vector<std::string>& special_tokens);

  std::string to_json() const;
  void save(const std::string& path) const;

  /// `match_special` false: special tokens' text (e.g. "<|im_end|>" inside a
  /// chat message) is encoded as plain text, never as the special token.
  std::vector<int32_t> encode(std::string_view text, bool match_special = true) const;
  /// Ids past the vocabulary (a padded model vocabulary) decode as U+FFFD; a negative id throws.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  std::optional<int32_t> token_id(std::string_view token) const;
  const std::string& token(int32_t id) const { return id_to_token_.at(static_cast<size_t>(id)); }
  bool byte_level() const { return byte_level_; }

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

 private:
  tokenizer();
  struct regex;  // compiled PCRE2 pattern
  void finish_setup(const std::string& source);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  std::vector<std::string> split(std::string_view text) const;

  bool byte_level_ = false;
  std::string split_pattern_;  // empty: no splitting (character level)
  std::unique_ptr<regex> regex_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left\x1fright" -> rank
  std::vector<std::pair<std::string, std::string>> merges_;
  struct added_token {
    int32_t id;
    std::string content;
    bool special;
  };
  std::vector<added_token> added_;  // longest first, for matching
  std::optional<int32_t> unk_id_;
  std::string unk_token_;
};

}  // namespace areal::kernels
