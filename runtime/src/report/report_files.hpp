// Reading the files the report draws, with errors that name the file and line.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace areal {
class tracer;
}

namespace areal::report {

struct file_lines {
  std::vector<std::string> text;
  bool ends_with_newline = true;  // false when the last line was cut off mid-write
};

/// The lines of a text file; throws input_error when it cannot be read.
file_lines read_lines(const std::filesystem::path& file);

/// The file's text, or nothing when it does not exist; throws input_error when it cannot be read.
std::optional<std::string> read_optional_text(const std::filesystem::path& file);

/// One run directory as the page's JSON (read_run_json's document, not yet text).
nlohmann::json read_run(const std::filesystem::path& directory, const tracer* live_trace);

/// The page's whole data document (report_data's, not yet text).
nlohmann::json report_document(const std::vector<std::filesystem::path>& runs,
                               const std::vector<std::filesystem::path>& benches, bool live, const tracer* live_trace);

/// JSON from a file or from its text; throws input_error naming the file, the line and the column.
nlohmann::json parse_json_file(const std::filesystem::path& file);
nlohmann::json parse_json_text(const std::string& text, const std::filesystem::path& file);

}  // namespace areal::report
