// The run's metrics lines (see run_metrics.hpp).
#include "areal/actors/run_metrics.hpp"

#include <algorithm>
#include <climits>

#include <nlohmann/json.hpp>

namespace areal {

batch_facts describe_batch(const std::vector<sample_summary>& batch, int64_t version) {
  batch_facts f;
  int64_t correct = 0, min_len = INT64_MAX;
  double reward = 0, traj_staleness = 0, token_staleness = 0;
  for (auto& t : batch) {
    auto n = t.output_tokens;
    f.tokens += n;
    min_len = std::min(min_len, n);
    f.response_tokens_max = std::max(f.response_tokens_max, n);
    reward += t.reward;
    correct += t.judged == static_cast<uint8_t>(verdict::correct);
    int64_t oldest = version;
    for (size_t i = 0; i + 1 < t.version_runs.size(); i += 2) {
      auto v = t.version_runs[i];
      auto count = t.version_runs[i + 1];
      auto behind = std::max<int64_t>(0, version - v);
      oldest = std::min(oldest, v);
      token_staleness += static_cast<double>(behind * count);
      f.staleness_token_max = std::max(f.staleness_token_max, behind);
      if (static_cast<int64_t>(f.staleness_token_histogram.size()) <= behind)
        f.staleness_token_histogram.resize(static_cast<size_t>(behind + 1));
      f.staleness_token_histogram[static_cast<size_t>(behind)] += count;
    }
    auto& p = f.producers.try_emplace(t.producer, 0, version).first->second;
    p.first++;
    p.second = std::min(p.second, oldest);
    traj_staleness += static_cast<double>(version - oldest);
    f.staleness_trajectory_max = std::max(f.staleness_trajectory_max, version - oldest);
  }
  f.samples = static_cast<int64_t>(batch.size());
  auto count = static_cast<double>(std::max<size_t>(1, batch.size()));
  f.reward_mean = reward / count;
  f.accuracy = static_cast<double>(correct) / count;
  f.response_tokens_mean = static_cast<double>(f.tokens) / count;
  f.response_tokens_min = batch.empty() ? 0 : min_len;
  f.staleness_trajectory_mean = traj_staleness / count;
  f.staleness_token_mean = token_staleness / static_cast<double>(std::max<int64_t>(1, f.tokens));
  return f;
}

run_metrics::run_metrics(const std::string& path, std::shared_ptr<tracer> trace, double elapsed_before,
                         bool remote_weights, std::optional<uint64_t> keep_bytes)
    : trace_(std::move(trace)), remote_weights_(remote_weights), elapsed_before_(elapsed_before) {
  if (path.empty())
    return;
  try {
    if (keep_bytes)
      truncate_file(path, *keep_bytes);
    file_ = append_only_file(path);
  } catch (const file_error& e) {
    failure_ = e.what();
  }
}

double run_metrics::run_seconds() const {
  return elapsed_before_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

void run_metrics::generated(int64_t tokens) {
  window_generated_ += tokens;
}

void run_metrics::transferred(double seconds) {
  window_transfer_s_ = std::max(window_transfer_s_, seconds);
}

void run_metrics::transfer_failed() {
  window_transfer_errors_++;
}

void run_metrics::write(const std::string& line, bool sync) {
  if (!file_.is_open() || !failure_.empty())
    return;
  try {
    file_.append(line + "\n");
  } catch (const file_error& e) {
    failure_ = e.what();
    return;
  }
  unsynced_ = true;
  if (sync)
    this->sync();
}

void run_metrics::sync() {
  if (!unsynced_ || !file_.is_open() || !failure_.empty())
    return;
  unsynced_ = false;
  try {
    file_.sync();
  } catch (const file_error& e) {
    failure_ = e.what();
  }
}

void run_metrics::step(const batch_facts& b, const train_report& report, const step_counters& c) {
  auto now = std::chrono::steady_clock::now();
  auto window = std::max(1e-9, std::chrono::duration<double>(now - window_start_).count());
  nlohmann::json producers = nlohmann::json::object();
  for (auto& [name, p] : b.producers)
    producers[name] = {{"trajectories", p.first}, {"oldest_version", p.second}};
  nlohmann::json line = {{"event", "step"},
                         {"step", c.step},
                         {"version", report.version},
                         {"time_s", run_seconds()},
                         {"samples", b.samples},
                         {"reward_mean", b.reward_mean},
                         {"accuracy", b.accuracy},
                         {"response_tokens_mean", b.response_tokens_mean},
                         {"response_tokens_min", b.response_tokens_min},
                         {"response_tokens_max", b.response_tokens_max},
                         {"staleness_trajectory_mean", b.staleness_trajectory_mean},
                         {"staleness_trajectory_max", b.staleness_trajectory_max},
                         {"staleness_token_mean", b.staleness_token_mean},
                         {"staleness_token_max", b.staleness_token_max},
                         {"staleness_token_histogram", b.staleness_token_histogram},
                         {"producers", producers},
                         {"prompt_positions", b.prompt_positions},
                         {"trained_tokens", report.tokens},
                         {"loss", report.loss},
                         {"kl", report.kl},
                         {"grad_norm", report.grad_norm},
                         {"lr", report.lr},
                         {"masked_fraction", static_cast<double>(report.behaviour_masked) /
                                                 static_cast<double>(std::max<int64_t>(1, report.tokens))},
                         {"generation_tokens_per_s", static_cast<double>(window_generated_) / window},
                         {"training_tokens_per_s", static_cast<double>(report.tokens) / std::max(1e-9, report.seconds)},
                         {"train_seconds", report.seconds},
                         {"weight_publish_s", report.publish_seconds}};
  nlohmann::json idle = nlohmann::json::object();
  if (trace_) {
    for (auto& [track, seconds] : trace_->busy_seconds()) {
      idle[track] = std::clamp(1.0 - (seconds - window_busy_[track]) / window, 0.0, 1.0);
      window_busy_[track] = seconds;
    }
    auto sync = trace_->seconds_in("weight sync");
    line["weight_sync_s"] = sync - window_weight_sync_;
    window_weight_sync_ = sync;
  }
  line["idle_fraction"] = idle;
  if (remote_weights_) {
    line["weight_transfer_s"] = window_transfer_s_;  // slowest remote subscriber
    line["weight_transfer_errors"] = window_transfer_errors_;
  }
  window_transfer_s_ = 0;
  window_transfer_errors_ = 0;
  line["rollout_workers"] = c.rollout_workers;
  line["reward_pools"] = c.reward_pools;
  line["admitted"] = c.admitted;
  line["trained"] = c.trained;
  line["dropped"] = c.dropped;
  line["running"] = c.running;
  line["buffered"] = c.buffered;
  write(line.dump(), false);
  window_start_ = now;
  window_generated_ = 0;
}

void run_metrics::eval(int64_t version, double accuracy, double mean_tokens) {
  write(nlohmann::json{{"event", "eval"},
                       {"time_s", run_seconds()},
                       {"version", version},
                       {"accuracy", accuracy},
                       {"response_tokens_mean", mean_tokens}}
            .dump());
}

void run_metrics::resume(int64_t version, int64_t steps, uint64_t source_position, size_t requeued_groups) {
  write(nlohmann::json{{"event", "resume"},
                       {"time_s", elapsed_before_},
                       {"version", version},
                       {"steps", steps},
                       {"source_position", source_position},
                       {"requeued_groups", requeued_groups}}
            .dump());
}

void run_metrics::end(const std::string& why, const step_counters& c, const std::map<std::string, int64_t>& drops,
                      const std::vector<std::string>& unfinished) {
  nlohmann::json line = {{"event", "end"},       {"time_s", run_seconds()}, {"why", why},
                         {"steps", c.step},      {"admitted", c.admitted},  {"trained", c.trained},
                         {"dropped", c.dropped}, {"drop_reasons", drops}};
  if (!unfinished.empty())
    line["unfinished"] = unfinished;
  write(line.dump(), true);
}

}  // namespace areal
