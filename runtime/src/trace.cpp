// The run's trace: spans per track, written as a Chrome/Perfetto trace (see trace.hpp).
#include "areal/runtime/trace.hpp"
#include "areal/runtime/files.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>

#include <nlohmann/json.hpp>

namespace areal {

int64_t trace_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

int64_t trace_clock_to_wall_ns() {
  auto wall =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return wall - trace_clock_ns();
}

std::vector<tracer::span_record> tracer::spans() const {
  std::lock_guard<std::mutex> guard{mutex_};
  std::vector<span_record> out;
  out.reserve(events_.size());
  for (auto& e : events_)
    out.push_back(
        {tracks_[static_cast<size_t>(e.track)], names_[static_cast<size_t>(e.what)], e.start_ns, e.end_ns, args_of(e)});
  return out;
}

tracer::tracer(std::string process_name, size_t max_spans)
    : process_(std::move(process_name)), max_spans_(max_spans), origin_ns_(trace_clock_ns()) {}

int tracer::intern(std::vector<std::string>& names, const std::string& name) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name)
      return static_cast<int>(i);
  names.push_back(name);
  return static_cast<int>(names.size() - 1);
}

tracer::span_args tracer::args_of(const event& e) const {
  span_args out;
  for (uint32_t i = e.first_arg; i < e.first_arg + e.arg_count; ++i)
    out.emplace_back(arg_names_[static_cast<size_t>(args_[i].first)], args_[i].second);
  return out;
}

void tracer::span(const std::string& track, const std::string& what, int64_t start_ns, int64_t end_ns,
                  const span_args& args) {
  std::lock_guard<std::mutex> guard{mutex_};
  auto t = intern(tracks_, track);
  auto w = intern(names_, what);
  busy_.resize(tracks_.size());
  by_what_.resize(names_.size());
  auto seconds = static_cast<double>(end_ns - start_ns) * 1e-9;
  busy_[t] += seconds;
  by_what_[w] += seconds;
  by_track_what_[{t, w}] += seconds;
  first_start_ns_ = std::min(first_start_ns_, start_ns);
  last_end_ns_ = std::max(last_end_ns_, end_ns);
  if (events_.size() < max_spans_) {
    events_.push_back(
        {t, w, start_ns, end_ns, static_cast<uint32_t>(args_.size()), static_cast<uint32_t>(args.size())});
    for (auto& [name, value] : args)
      args_.emplace_back(intern(arg_names_, name), value);
  } else
    ++spans_left_out_;
}

std::map<std::string, double> tracer::busy_seconds() const {
  std::lock_guard<std::mutex> guard{mutex_};
  std::map<std::string, double> out;
  for (size_t i = 0; i < tracks_.size(); ++i)
    out[tracks_[i]] = busy_[i];
  return out;
}

tracer::activity tracer::activities() const {
  std::lock_guard<std::mutex> guard{mutex_};
  activity out;
  for (auto& [key, seconds] : by_track_what_)
    out.seconds[tracks_[static_cast<size_t>(key.first)]][names_[static_cast<size_t>(key.second)]] = seconds;
  if (last_end_ns_ > first_start_ns_)
    out.extent_s = static_cast<double>(last_end_ns_ - first_start_ns_) * 1e-9;
  return out;
}

double tracer::seconds_in(const std::string& what) const {
  std::lock_guard<std::mutex> guard{mutex_};
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == what)
      return by_what_[i];
  return 0;
}

void tracer::write_chrome_trace(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> guard{mutex_};
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", process_}}}});
    for (size_t i = 0; i < tracks_.size(); ++i)
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", 1},
                        {"tid", static_cast<int>(i) + 1},
                        {"args", {{"name", tracks_[i]}}}});
    for (auto& e : events_) {
      nlohmann::json x = {{"name", names_[e.what]},
                          {"ph", "X"},
                          {"pid", 1},
                          {"tid", e.track + 1},
                          {"ts", static_cast<double>(e.start_ns - origin_ns_) / 1e3},
                          {"dur", static_cast<double>(e.end_ns - e.start_ns) / 1e3}};
      if (e.arg_count > 0) {
        auto& a = x["args"] = nlohmann::json::object();
        for (auto& [name, value] : args_of(e))
          a[name] = value;
      }
      events.push_back(std::move(x));
    }
    if (spans_left_out_ > 0)
      events.push_back({{"name", "spans left out (limit reached)"},
                        {"ph", "i"},
                        {"s", "g"},
                        {"pid", 1},
                        {"ts", 0},
                        {"args", {{"count", spans_left_out_}}}});
  }
  write_file_atomically(path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n");
}

}  // namespace areal
