// The controller's checkpoint record (see run_checkpoint.hpp).
#include "areal/actors/run_checkpoint.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "areal/messages/codec.hpp"

namespace areal {

void controller_checkpoint::set_stream(const stream_position& p) {
  source_position = p.source_position;
  requeue = p.requeue;
  dropped_positions = p.dropped_positions;
  next_group = p.next_group;
  requeue_groups = p.requeue_groups;
}

std::string controller_checkpoint::to_bytes() const {
  auto bytes = encode(static_cast<const run_state&>(*this));
  if (!bytes)
    throw std::invalid_argument("the controller's checkpoint cannot be encoded: " + describe(bytes.error()));
  return std::string(bytes->begin(), bytes->end());
}

controller_checkpoint controller_checkpoint::from_bytes(const std::string& bytes, const std::string& where) {
  auto state = decode<run_state>(bytes.data(), bytes.size());
  if (!state)
    throw std::invalid_argument(where + ": not a controller checkpoint of this build (" + describe(state.error()) +
                                ")");
  controller_checkpoint c;
  static_cast<run_state&>(c) = std::move(*state);
  return c;
}

controller_checkpoint controller_checkpoint::load(const std::string& checkpoint_directory) {
  auto path = checkpoint_directory + "/" + file_name;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::invalid_argument(path + ": cannot read the controller's checkpoint");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return from_bytes(bytes.str(), path);
}

}  // namespace areal
