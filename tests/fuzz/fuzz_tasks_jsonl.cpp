// A JSONL task file: its items, or an std::invalid_argument naming the line.
#include <cstdint>
#include <sstream>

#include "areal/tasks/tasks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in{std::string{reinterpret_cast<const char*>(data), size}};
  try {
    areal::tasks::jsonl_counts counts;
    auto items = areal::tasks::parse_jsonl(in, "tasks.jsonl", &counts);
    if (items.size() + counts.blank_lines != counts.lines)
      __builtin_trap();  // every line is an item or blank
  } catch (const std::invalid_argument& e) {
    if (std::string_view{e.what()}.rfind("tasks.jsonl:", 0) != 0)
      __builtin_trap();  // the error names the file and line
  }
  return 0;
}
