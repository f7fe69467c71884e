// The run configuration and topology: TOML text, then --set overrides (one per
// line) after a NUL. parse_config reports every problem as an error line; it
// never throws, so any exception is a finding.
#include <cstdint>
#include <sstream>

#include "areal/runtime/config.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto input = areal::fuzz::parts(data, size, 2, 2);
  std::vector<std::string> overrides;
  std::istringstream lines{input[1]};
  for (std::string line; std::getline(lines, line);)
    overrides.push_back(line);
  auto result = areal::parse_config(input[0], "fuzz.toml", overrides);
  if (result.config.has_value() == !result.errors.empty())
    __builtin_trap();  // a configuration or errors, never both, never neither
  for (auto& e : result.errors)
    if (e.empty())
      __builtin_trap();  // every error says something
  if (result.config)
    (void)result.config->controller_node();  // a valid topology has its controller
  return 0;
}
