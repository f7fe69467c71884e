// Shared by the fuzz harnesses: one input cut into the parts a harness needs.
// Parts are separated by a NUL byte, so that the seed files stay readable text
// and libFuzzer's mutations move bytes between parts freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace areal::fuzz {

/// The NUL-separated parts of the input; always at least `at_least` of them
/// (missing ones empty), never more than `at_most` (the last keeps the rest).
inline std::vector<std::string> parts(const uint8_t* data, size_t size, size_t at_least, size_t at_most) {
  std::string_view text{reinterpret_cast<const char*>(data), size};
  std::vector<std::string> out;
  while (out.size() + 1 < at_most) {
    auto cut = text.find('\0');
    if (cut == std::string_view::npos)
      break;
    out.emplace_back(text.substr(0, cut));
    text.remove_prefix(cut + 1);
  }
  out.emplace_back(text);
  while (out.size() < at_least)
    out.emplace_back();
  return out;
}

}  // namespace areal::fuzz
