// The controller's part of a run checkpoint: counters, drop reasons and the
// prompt stream's position (run_state, a Cap'n Proto record of
// messages/run_state.capnp), saved next to the trainer's state in the same
// atomic checkpoint directory; read and written here only.
#pragma once

#include <string>

#include "areal/actors/prompt_stream.hpp"
#include "areal/messages/records.hpp"

namespace areal {

struct controller_checkpoint : run_state {
  /// Its file in a run checkpoint directory.
  static constexpr const char* file_name = "controller_state.capnp";

  /// The prompt stream's part.
  stream_position stream() const {
    return {source_position, requeue, dropped_positions, next_group, requeue_groups, saved};
  }
  void set_stream(const stream_position& p);

  /// The file's bytes.
  std::string to_bytes() const;
  /// Throws std::invalid_argument naming `where` when the bytes are not a controller checkpoint.
  static controller_checkpoint from_bytes(const std::string& bytes, const std::string& where);
  /// Reads file_name in a checkpoint directory; throws std::invalid_argument naming the file.
  static controller_checkpoint load(const std::string& checkpoint_directory);
};

}  // namespace areal
