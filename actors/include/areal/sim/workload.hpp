// What a simulated run generates: prompt and response lengths and the cost of
// scoring each answer, drawn per sample from its id and the seed (so the same
// sample has the same length in every configuration compared, whatever the
// order it is generated in). No actor logic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace areal::sim {

struct workload {
  int64_t prompt_tokens = 256;        // every prompt
  int64_t max_new_tokens = 27648;     // the cap of a response (finish "length" there)
  double length_median = 6000;        // response tokens: log-normal with this median...
  double length_sigma = 0.8;          // ...and this spread, capped at max_new_tokens
  std::vector<int64_t> length_table;  // when not empty: lengths drawn uniformly from these instead
  std::string length_source = "log-normal";
  double reward_median_s = 0.005;  // scoring one answer: log-normal seconds
  double reward_sigma = 0.5;
  int64_t reward_workers = 64;  // parallel scorers
  uint64_t seed = 1;

  /// The response length of sample (group, index): in [1, max_new_tokens].
  int64_t response_tokens(uint64_t group, uint32_t index) const;
  /// Seconds to score it.
  double reward_seconds(uint64_t group, uint32_t index) const;
  /// Mean response tokens (by drawing 20,000 samples' lengths).
  double mean_response_tokens() const;
};

/// Reads a length table: one response length per line, or "LENGTH COUNT";
/// blank lines and lines from '#' on are skipped. A file named *.jsonl is a
/// run's trajectories.jsonl (rl.record_trajectories): its responses' lengths. Throws std::runtime_error
/// with the file and line of what it cannot read.
std::vector<int64_t> read_length_table(const std::string& path);

}  // namespace areal::sim
