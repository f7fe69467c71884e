// The controller's part of a run checkpoint: counters, drop reasons and the
// prompt stream's position, saved next to the trainer's state in the same
// atomic checkpoint directory, read and written here only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "areal/actors/prompt_stream.hpp"

namespace areal {

struct controller_checkpoint {
  int64_t version = 0;
  int64_t steps = 0;
  int64_t admitted = 0;  // = trained + dropped: unfinished work is re-queued, not counted
  int64_t trained = 0;
  int64_t dropped = 0;
  std::map<std::string, int64_t> drop_reasons;
  int64_t max_staleness = 0;
  double reward_mean_first = 0;
  double reward_mean_last = 0;
  uint64_t source_position = 0;             // prompts taken from the stream
  std::vector<uint64_t> requeue;            // stream positions of groups started but not trained
  std::vector<uint64_t> dropped_positions;  // stream positions of the groups dropped (with a reason)
  uint64_t next_group = 0;
  int64_t generated_tokens = 0;
  int64_t trained_tokens = 0;
  double elapsed_s = 0;  // run time before this checkpoint

  /// Its file in a run checkpoint directory.
  static constexpr const char* file_name = "controller_state.json";

  /// The prompt stream's part.
  stream_position stream() const { return {source_position, requeue, dropped_positions, next_group}; }
  void set_stream(const stream_position& p);

  std::string to_json() const;
  /// Throws std::invalid_argument naming `where` when the text is not a controller checkpoint.
  static controller_checkpoint from_json(const std::string& text, const std::string& where);
  /// Reads file_name in a checkpoint directory; throws std::invalid_argument naming the file.
  static controller_checkpoint load(const std::string& checkpoint_directory);
};

}  // namespace areal
