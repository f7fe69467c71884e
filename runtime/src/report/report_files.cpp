// Reading the files the report draws (see report_files.hpp).
#include "report_files.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "areal/runtime/report.hpp"

namespace areal::report {
namespace fs = std::filesystem;

std::optional<std::string> read_optional_text(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec))
    return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw input_error(file.string() + ": cannot be read (" + std::strerror(errno) + ")");
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad())
    throw input_error(file.string() + ": cannot be read (" + std::strerror(errno) + ")");
  return text;
}

file_lines read_lines(const fs::path& file) {
  auto text = read_optional_text(file);
  if (!text)
    throw input_error(file.string() + ": no such file");
  file_lines out;
  out.ends_with_newline = text->empty() || text->back() == '\n';
  size_t start = 0;
  while (start < text->size()) {
    auto end = text->find('\n', start);
    if (end == std::string::npos)
      end = text->size();
    out.text.push_back(text->substr(start, end - start));
    start = end + 1;
  }
  return out;
}

nlohmann::json parse_json_text(const std::string& text, const fs::path& file) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // The byte the parser stopped at, as a line and column.
    size_t at = std::min(e.byte > 0 ? e.byte - 1 : 0, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at; ++i, ++column)
      if (text[i] == '\n')
        line++, column = 0;
    throw input_error(file.string() + " line " + std::to_string(line) + " column " + std::to_string(column) +
                      ": not valid JSON; the file is damaged or not the kind the report reads (" +
                      std::string{e.what()} + ")");
  }
}

nlohmann::json parse_json_file(const fs::path& file) {
  auto text = read_optional_text(file);
  if (!text)
    throw input_error(file.string() + ": no such file");
  return parse_json_text(*text, file);
}

}  // namespace areal::report
