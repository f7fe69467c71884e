// Small text helpers shared by the verifiers (internal).
#pragma once

#include <cctype>
#include <string>
#include <string_view>

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

}  // namespace areal::reward::text
