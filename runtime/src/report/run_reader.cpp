// Reads what a run directory holds into the report page's JSON (see report.hpp):
// metrics.jsonl as columns per step, its eval/resume/end lines, the timeline
// summary of trace.json (or of the live tracer), the configuration, the
// machine facts and whether the run is still going.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "areal/runtime/report.hpp"
#include "areal/runtime/trace.hpp"
#include "report_files.hpp"

namespace areal::report {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The step line's numbers drawn as columns (absent ones are null).
const char* const step_columns[] = {"step",
                                    "version",
                                    "time_s",
                                    "reward_mean",
                                    "accuracy",
                                    "staleness_token_mean",
                                    "staleness_token_max",
                                    "staleness_trajectory_mean",
                                    "masked_fraction",
                                    "generation_tokens_per_s",
                                    "training_tokens_per_s",
                                    "weight_publish_s",
                                    "weight_sync_s",
                                    "weight_transfer_s",
                                    "admitted",
                                    "trained",
                                    "dropped"};

json number_or_null(const json& line, const char* key) {
  auto it = line.find(key);
  return it != line.end() && it->is_number() ? *it : json(nullptr);
}

// Fills a column with nulls up to `count` rows.
void pad(json& column, int64_t count) {
  while (static_cast<int64_t>(column.size()) < count)
    column.push_back(nullptr);
}

// True while another process holds the run's lock (the run is going): a shared
// flock that cannot be had. Held for an instant only, and never created.
bool lock_held(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

struct metrics {
  json steps = json::object();
  json idle = json::object();  // track -> column
  json evals = {{"time_s", json::array()}, {"version", json::array()}, {"step", json::array()},
                {"accuracy", json::array()}};
  std::vector<int64_t> histogram;
  json resumes = json::array();
  json end;  // the end line, when there is one
  json last_step;
  int64_t count = 0;
};

metrics read_metrics(const fs::path& file, std::vector<std::string>& warnings) {
  metrics m;
  for (auto c : step_columns)
    m.steps[c] = json::array();
  auto lines = read_lines(file);
  int64_t previous_step = -1;
  for (size_t i = 0; i < lines.text.size(); ++i) {
    auto& text = lines.text[i];
    auto where = file.string() + " line " + std::to_string(i + 1);
    if (text.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    json line = json::parse(text, nullptr, false);
    if (line.is_discarded() || !line.is_object() || !line.contains("event")) {
      if (i + 1 == lines.text.size() && !lines.ends_with_newline) {
        warnings.push_back(where + " is cut off (the run stopped while writing it): left out");
        break;
      }
      throw input_error(where + ": " + (line.is_discarded() ? "not JSON" : "not a metrics record (no \"event\")") +
                        "; this file is written by areal runs, one JSON object per line: restore it or remove "
                        "the damaged line");
    }
    auto event = line.value("event", std::string{});
    if (event == "step") {
      auto step = line.value("step", int64_t{-1});
      if (step <= previous_step)
        warnings.push_back(where + ": step " + std::to_string(step) + " comes after step " +
                           std::to_string(previous_step) + " (two runs in one file?)");
      previous_step = step;
      for (auto c : step_columns)
        m.steps[c].push_back(number_or_null(line, c));
      auto idle = line.value("idle_fraction", json::object());
      for (auto& [track, value] : idle.items())
        if (!m.idle.contains(track))
          m.idle[track] = json::array();
      for (auto& [track, column] : m.idle.items()) {
        pad(column, m.count);  // a track that appeared later
        column.push_back(idle.contains(track) ? idle[track] : json(nullptr));
      }
      auto histogram = line.value("staleness_token_histogram", std::vector<int64_t>{});
      if (histogram.size() > m.histogram.size())
        m.histogram.resize(histogram.size());
      for (size_t k = 0; k < histogram.size(); ++k)
        m.histogram[k] += histogram[k];
      m.last_step = line;
      m.count++;
    } else if (event == "eval") {
      m.evals["time_s"].push_back(number_or_null(line, "time_s"));
      m.evals["version"].push_back(number_or_null(line, "version"));
      m.evals["step"].push_back(number_or_null(line, "version"));  // one version per step trained
      m.evals["accuracy"].push_back(number_or_null(line, "accuracy"));
    } else if (event == "resume") {
      m.resumes.push_back({{"time_s", number_or_null(line, "time_s")}, {"steps", number_or_null(line, "steps")}});
    } else if (event == "end") {
      m.end = line;
    }  // other events: written by later versions, not drawn
  }
  for (auto& [track, column] : m.idle.items())
    pad(column, m.count);
  return m;
}

// The time of every track by kind of span, from a Chrome trace (areal's trace.json).
json timeline_of_trace_file(const fs::path& file) {
  json trace = parse_json_file(file);
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    throw input_error(file.string() + ": not a Chrome trace (no \"traceEvents\" list); areal writes it at the run's "
                                      "end: remove the file or run the report without it");
  std::map<int64_t, std::string> names;
  for (auto& e : trace["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
      names[e.value("tid", int64_t{0})] = e["args"].value("name", "");
  std::map<std::string, std::map<std::string, double>> seconds;
  double first = 0, last = 0;
  bool any = false;
  for (auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X")
      continue;
    auto ts = e.value("ts", 0.0), dur = e.value("dur", 0.0);
    auto tid = e.value("tid", int64_t{0});
    auto track = names.count(tid) ? names[tid] : "track " + std::to_string(tid);
    seconds[track][e.value("name", "?")] += dur * 1e-6;
    first = any ? std::min(first, ts) : ts;
    last = any ? std::max(last, ts + dur) : ts + dur;
    any = true;
  }
  if (!any)
    return nullptr;
  return {{"tracks", seconds}, {"span_s", (last - first) * 1e-6}};
}

json timeline_of_tracer(const tracer& trace) {
  auto a = trace.activities();
  if (a.seconds.empty())
    return nullptr;
  return {{"tracks", a.seconds}, {"span_s", a.extent_s}};
}

// The activities in the order the page lists them: the pipeline's first.
void order_activities(json& timeline) {
  std::vector<std::string> order = {"generate", "weight sync", "reward", "train", "evaluate", "checkpoint"};
  std::vector<std::string> seen;
  for (auto& [track, kinds] : timeline["tracks"].items())
    for (auto& [kind, s] : kinds.items())
      if (std::find(order.begin(), order.end(), kind) == order.end() &&
          std::find(seen.begin(), seen.end(), kind) == seen.end())
        seen.push_back(kind);
  std::vector<std::string> present;
  for (auto& k : order)
    for (auto& [track, kinds] : timeline["tracks"].items())
      if (kinds.contains(k)) {
        present.push_back(k);
        break;
      }
  present.insert(present.end(), seen.begin(), seen.end());
  timeline["activities"] = present;
}

}  // namespace

json read_run(const fs::path& directory, const tracer* live_trace) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec))
    throw input_error(directory.string() + ": no such directory; give the run directories to draw (e.g. runs/single-node)");
  auto metrics_file = directory / "metrics.jsonl";
  if (!fs::exists(metrics_file, ec))
    throw input_error(directory.string() + ": not a run directory (no metrics.jsonl); give a directory an areal run "
                                           "wrote (run.output_dir/run.name, e.g. runs/single-node)");
  std::vector<std::string> warnings;
  auto m = read_metrics(metrics_file, warnings);

  json run = {{"dir", directory.string()}, {"name", directory.filename().string()}};
  std::string mode = "?";
  json eta = nullptr;
  if (auto config_text = read_optional_text(directory / "config.toml")) {
    run["config"] = *config_text;
    try {
      auto t = toml::parse(*config_text);
      run["name"] = t["run"]["name"].value_or(run["name"].get<std::string>());
      mode = t["rl"]["mode"].value_or(std::string{"async"});
      if (auto e = t["rl"]["eta"].value<int64_t>())
        eta = *e;
    } catch (const toml::parse_error& e) {
      warnings.push_back((directory / "config.toml").string() + " is not TOML (" + std::string{e.description()} +
                         "): the run's mode and η are unknown");
    }
  } else {
    warnings.push_back("no config.toml: the run's mode and η are unknown");
  }
  if (mode == "sync")
    eta = 0;
  run["mode"] = mode;
  run["eta"] = eta;
  run["label"] = run["name"].get<std::string>() + " (" + mode +
                 (mode == "async" && eta.is_number() ? ", η=" + std::to_string(eta.get<int64_t>()) : "") + ")";
  if (auto machine = read_optional_text(directory / "machine.json"))
    run["machine"] = parse_json_text(*machine, directory / "machine.json");
  if (auto summary = read_optional_text(directory / "summary.json"))
    run["summary"] = parse_json_text(*summary, directory / "summary.json");

  bool going = lock_held(directory / "run.lock");
  if (!m.end.is_null())
    run["state"] = "finished (" + m.end.value("why", std::string{"?"}) + ")";
  else if (going)
    run["state"] = "in progress";
  else
    run["state"] = "stopped without its end line (killed or crashed); --resume continues it from its checkpoint";
  if (m.resumes.size() > 0)
    run["state"] = run["state"].get<std::string>() + "; resumed " + std::to_string(m.resumes.size()) + " time(s)";

  run["steps"] = m.steps;
  run["step_count"] = m.count;
  run["idle"] = m.idle;
  run["evals"] = m.evals;
  run["staleness_histogram"] = m.histogram;
  run["resumes"] = m.resumes;
  double wall = m.last_step.is_null() ? 0.0 : m.last_step.value("time_s", 0.0);
  if (!m.end.is_null())
    wall = m.end.value("time_s", wall);
  run["wall_s"] = wall;
  auto& counts = m.end.is_null() ? m.last_step : m.end;
  run["accounting"] = {{"admitted", number_or_null(counts, "admitted")},
                       {"trained", number_or_null(counts, "trained")},
                       {"dropped", number_or_null(counts, "dropped")},
                       {"drop_reasons", m.end.is_null() ? json::object() : m.end.value("drop_reasons", json::object())},
                       {"from", !m.end.is_null()        ? "the end line"
                                : m.last_step.is_null() ? "no step yet"
                                                        : "step " + std::to_string(m.last_step.value("step", 0))}};

  json timeline = nullptr;
  if (live_trace) {
    timeline = timeline_of_tracer(*live_trace);
  } else if (fs::exists(directory / "trace.json", ec)) {
    timeline = timeline_of_trace_file(directory / "trace.json");
    if (!m.resumes.empty())
      warnings.push_back("trace.json holds the last segment of the resumed run only");
  } else {
    run["timeline_missing"] = going ? "no trace.json yet: it is written when the run ends (the live dashboard shows it "
                                      "while the run lasts)"
                                    : "no trace.json: the run ended before writing it";
  }
  if (!timeline.is_null())
    order_activities(timeline);
  run["timeline"] = timeline;
  run["warnings"] = warnings;
  return run;
}

std::string read_run_json(const fs::path& directory, const tracer* live_trace) {
  return read_run(directory, live_trace).dump();
}

}  // namespace areal::report
