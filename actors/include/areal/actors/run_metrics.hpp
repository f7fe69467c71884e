// The run's metrics: what a batch says about itself (lengths, accuracy,
// staleness per trajectory and per token, producers), the window since the last
// step (generated tokens, busy time of every trace track, weight transfers),
// and the JSON lines of metrics.jsonl (step, eval, resume, end). No actor logic.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "areal/actors/interfaces.hpp"
#include "areal/messages/records.hpp"
#include "areal/runtime/files.hpp"
#include "areal/runtime/trace.hpp"

namespace areal {

/// What the metrics line of a step says about its batch, taken when it is formed.
struct batch_facts {
  int64_t samples = 0;
  int64_t tokens = 0;  // response tokens
  double reward_mean = 0, accuracy = 0, response_tokens_mean = 0;
  int64_t response_tokens_min = 0, response_tokens_max = 0;
  // Versions behind the policy being trained: per trajectory (its oldest token) and per token.
  double staleness_trajectory_mean = 0, staleness_token_mean = 0;
  int64_t staleness_trajectory_max = 0, staleness_token_max = 0;
  std::vector<int64_t> staleness_token_histogram;
  std::map<std::string, std::pair<int64_t, int64_t>> producers;  // name -> (trajectories, oldest token version)
  std::vector<uint64_t> prompt_positions;                        // of the batch's groups in the prompt stream
};

batch_facts describe_batch(const std::vector<sample_summary>& batch, int64_t version);

/// The run's counters at the end of a step, for its metrics line.
struct step_counters {
  int64_t step = 0;
  int64_t admitted = 0, trained = 0, dropped = 0, running = 0, buffered = 0;
  size_t rollout_workers = 0, reward_pools = 0;
};

class run_metrics {
 public:
  /// Appends to `path` (nothing is written when it is empty); `elapsed_before`:
  /// seconds of the run before a resume; `keep_bytes` (a resume): the file is
  /// first cut back to its size at the checkpoint, so no step appears twice.
  run_metrics(const std::string& path, std::shared_ptr<tracer> trace, double elapsed_before, bool remote_weights,
              std::optional<uint64_t> keep_bytes = std::nullopt);

  /// The first write that failed (e.g. a full disk), with its file and
  /// reason; empty while every line was written. Lines after it are not written.
  const std::string& failure() const { return failure_; }
  /// Bytes of whole lines in the file, for the checkpoint (what a resume
  /// keeps); -1 when no file is written.
  int64_t bytes() const { return file_.is_open() ? static_cast<int64_t>(file_.size()) : -1; }

  /// Seconds of the run, resumed runs included.
  double run_seconds() const;
  /// Response tokens that reached the buffer.
  void generated(int64_t tokens);
  /// A weight transfer to another node took `seconds`, or failed.
  void transferred(double seconds);
  void transfer_failed();

  /// The line of a training step, written but not yet durable (sync()); the window restarts.
  void step(const batch_facts& batch, const train_report& report, const step_counters& counters);
  /// Makes the lines written so far durable. The controller calls it once the
  /// next step is on its way: waiting for the disk before that (0.9 ms a step
  /// in the demo, two busy cores delaying the file system's commit; more on a
  /// slow disk) kept the trainer idle.
  void sync();
  /// Whether every line written so far was made durable.
  bool durable() const { return !unsynced_; }
  void eval(int64_t version, double accuracy, double mean_tokens);
  void resume(int64_t version, int64_t steps, uint64_t source_position, size_t requeued_groups);
  void end(const std::string& why, const step_counters& counters, const std::map<std::string, int64_t>& drops,
           const std::vector<std::string>& unfinished);

 private:
  // One line, one write; `sync` makes it durable (at step boundaries).
  void write(const std::string& line, bool sync = false);

  std::shared_ptr<tracer> trace_;
  bool remote_weights_;
  double elapsed_before_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  // The window: since the previous step's line.
  std::chrono::steady_clock::time_point window_start_ = started_;
  int64_t window_generated_ = 0;
  std::map<std::string, double> window_busy_;
  double window_weight_sync_ = 0;
  double window_transfer_s_ = 0;  // slowest remote weight transfer
  int64_t window_transfer_errors_ = 0;
  append_only_file file_;
  bool unsynced_ = false;  // a line was written since the last sync
  std::string failure_;
};

}  // namespace areal
