// Small text helpers shared by the verifiers (internal).
#pragma once

#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace areal::reward::text {

/// `s` without leading and trailing whitespace.
inline std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return std::string{s.substr(b, e - b)};
}

// Content of the brace group opening at s[open] == '{', or nullopt when unbalanced.
inline std::optional<std::pair<std::string, size_t>> brace_group(std::string_view s, size_t open) {
  if (open >= s.size() || s[open] != '{')
    return std::nullopt;
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{')
      ++depth;
    else if (s[i] == '}' && --depth == 0)
      return std::make_pair(std::string{s.substr(open + 1, i - open - 1)}, i + 1);
  }
  return std::nullopt;
}

inline bool is_number_char(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

inline std::string lowercase(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace areal::reward::text
