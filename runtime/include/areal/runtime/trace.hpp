// The run's timeline: every actor records what it was busy with (generation
// steps, reward checks, training, weight sync) as spans on its own track. The
// tracer keeps the spans for a Chrome-trace JSON file (open it in Perfetto or
// chrome://tracing) and the busy time per track, from which the metrics derive
// each actor's idle fraction. Thread-safe; one per process.
#pragma once

#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace areal {

/// Nanoseconds on the clock every span uses (steady, process-wide).
int64_t trace_clock_ns();
/// Wall-clock time (system clock, ns since the epoch) minus trace_clock_ns(): converts span times to wall time.
int64_t trace_clock_to_wall_ns();
/// CPU time the calling thread has used, ns. Beside a span's wall time it says
/// how much of the span the thread computed: the rest it waited, for a core
/// taken by another thread or for other threads.
int64_t thread_cpu_ns();

class tracer {
 public:
  /// At most `max_spans` spans are kept for the file; busy times count every span.
  explicit tracer(std::string process_name, size_t max_spans = 2'000'000);

  /// Numbers that say what a span did (a Chrome trace's "args"), e.g. an
  /// engine step's batch: what a replay of the run fits its costs to.
  using span_args = std::vector<std::pair<std::string, int64_t>>;

  /// `track` is busy with `what` from start_ns to end_ns (trace_clock_ns values).
  void span(const std::string& track, const std::string& what, int64_t start_ns, int64_t end_ns,
            const span_args& args = {});
  /// Total busy seconds of each track so far.
  std::map<std::string, double> busy_seconds() const;
  /// Total seconds spent in spans named `what`, over all tracks.
  double seconds_in(const std::string& what) const;
  /// Every span kept so far: (track, what, start_ns, end_ns).
  struct span_record {
    std::string track, what;
    int64_t start_ns, end_ns;
    span_args args;
  };
  std::vector<span_record> spans() const;
  /// Seconds of every track in each kind of span, and the seconds from the
  /// first span's start to the last one's end (the report's timeline summary).
  struct activity {
    std::map<std::string, std::map<std::string, double>> seconds;  // track -> what -> seconds
    double extent_s = 0;
  };
  activity activities() const;
  /// Writes the Chrome-trace JSON atomically (files.hpp); throws file_error.
  void write_chrome_trace(const std::string& path) const;

  /// Records a span over its own lifetime.
  class scope {
   public:
    scope(tracer* t, std::string track, std::string what)
        : t_(t), track_(std::move(track)), what_(std::move(what)), start_(trace_clock_ns()) {}
    ~scope() {
      if (!t_)
        return;
      if (cpu_start_ >= 0)
        args.emplace_back("cpu_us", (thread_cpu_ns() - cpu_start_) / 1000);
      t_->span(track_, what_, start_, trace_clock_ns(), args);
    }
    /// Records the calling thread's CPU time from here to the span's end as
    /// the argument "cpu_us" (the scope must end on the same thread).
    void count_thread_cpu() {
      if (t_)
        cpu_start_ = thread_cpu_ns();
    }
    span_args args;  // recorded with the span
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

   private:
    tracer* t_;
    std::string track_, what_;
    int64_t start_;
    int64_t cpu_start_ = -1;
  };

 private:
  struct event {
    int track;
    int what;
    int64_t start_ns, end_ns;
    uint32_t first_arg, arg_count;  // in args_
  };
  int intern(std::vector<std::string>& names, const std::string& name);
  span_args args_of(const event& e) const;

  std::string process_;
  size_t max_spans_;
  int64_t origin_ns_;
  mutable std::mutex mutex_;
  std::vector<std::string> tracks_, names_, arg_names_;
  std::vector<event> events_;
  std::vector<std::pair<int, int64_t>> args_;  // (name in arg_names_, value) of the kept events
  std::vector<double> busy_;                   // by track
  std::vector<double> by_what_;                // by name
  std::map<std::pair<int, int>, double> by_track_what_;
  int64_t first_start_ns_ = INT64_MAX, last_end_ns_ = INT64_MIN;
  uint64_t spans_left_out_ = 0;
};

}  // namespace areal
