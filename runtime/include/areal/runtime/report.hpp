// The run's pictures: `areal report` writes one self-contained HTML file
// (the charting library, uPlot, inlined) from run directories and benchmark
// JSON files, and the live dashboard serves the same page over HTTP on
// loopback while a run lasts. The page's data is one JSON document:
//   {"version", "made", "live", "runs": [run...], "benches": [bench...]}
// read here from what a run leaves (metrics.jsonl, trace.json, config.toml,
// machine.json, summary.json, run.lock), whatever state it was left in.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace areal {
class tracer;
}

namespace areal::report {

/// A file the report cannot read: the message names the file (and line) and what to do.
struct input_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One run directory as the page's JSON (a text). `live_trace`, when given,
/// is the running process's own tracer, read instead of trace.json (which is
/// written at the run's end). Throws input_error.
std::string read_run_json(const std::filesystem::path& directory, const tracer* live_trace = nullptr);

/// The page's whole data document (a JSON text) for these runs and benchmark
/// files. Throws input_error naming the first file that cannot be read.
std::string report_data(const std::vector<std::filesystem::path>& runs,
                        const std::vector<std::filesystem::path>& benches, bool live,
                        const tracer* live_trace = nullptr);

/// The HTML page for a data document: self-contained (styles, uPlot and the
/// drawing script inlined). A live page also polls data.json beside it.
std::string page_html(const std::string& data_json, bool live);

/// `areal report RUN_DIR... [--bench FILE.json]... [--out FILE]` (args after
/// "report"); returns the exit code: 0 written, 2 bad arguments or input.
int report_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

/// The live dashboard: the report page of one run directory, served on
/// 127.0.0.1:port while the run lasts (GET / and GET /data.json).
class dashboard {
 public:
  /// Starts serving; throws std::runtime_error when the port cannot be bound.
  dashboard(std::filesystem::path run_directory, uint16_t port, std::shared_ptr<const tracer> trace);
  ~dashboard();
  dashboard(const dashboard&) = delete;
  dashboard& operator=(const dashboard&) = delete;
  /// "http://127.0.0.1:PORT/"
  std::string address() const;

 private:
  struct server;
  std::unique_ptr<server> server_;
};

}  // namespace areal::report
