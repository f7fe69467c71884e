// The pieces the record codecs share (codec.cpp, codec_run_state.cpp): list
// and text conversion, the size limit, the error kinds, reading a root with
// its schema checked, and a trajectory written into or read from a record of
// its own or one inside another. Internal.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "areal/messages/codec.hpp"
#include "trajectory.capnp.h"

namespace areal::codec_detail {

template <class Builder, class Vec>
void fill(Builder list, const Vec& xs) {
  for (unsigned i = 0; i < xs.size(); ++i)
    list.set(i, xs[i]);
}

template <class Out, class Reader>
std::vector<Out> to_vector(Reader list) {
  std::vector<Out> out;
  out.reserve(list.size());
  for (auto x : list)
    out.push_back(static_cast<Out>(x));
  return out;
}

inline std::vector<std::string> to_strings(capnp::List<capnp::Text>::Reader list) {
  std::vector<std::string> out;
  out.reserve(list.size());
  for (auto x : list)
    out.emplace_back(x.cStr(), x.size());
  return out;
}

// Text as Cap'n Proto stores it, whole: kj's conversion from std::string goes
// through c_str() and would end the text at its first NUL byte.
inline capnp::Text::Reader text(const std::string& s) {
  return {s.data(), s.size()};
}

inline std::string to_std(capnp::Text::Reader x) {
  return std::string(x.cStr(), x.size());
}

inline caf::expected<std::vector<char>> finish(capnp::MallocMessageBuilder& builder) {
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  if (bytes.size() > max_message_bytes)
    return caf::make_error(wire_errc::too_large,
                           "record of " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
                               std::to_string(max_message_bytes) + "; send bulk data through the weight transport");
  return std::vector<char>(reinterpret_cast<const char*>(bytes.begin()), reinterpret_cast<const char*>(bytes.end()));
}

inline caf::error invalid(std::string what) {
  return caf::make_error(wire_errc::invalid_record, std::move(what));
}

inline caf::error check_schema(const char* record, uint32_t version) {
  if (version == schema_version)
    return {};
  return caf::make_error(wire_errc::schema_mismatch, std::string{record} + " written with schema version " +
                                                         std::to_string(version) + ", this build reads version " +
                                                         std::to_string(schema_version) +
                                                         "; run the same areal build on every node");
}

// Runs `read` on the root of type Root of the message in [data, data+size).
template <class Root, class Result, class Read>
caf::expected<Result> read_root(const char* record, const char* data, size_t size, Read read) {
  if (size == 0 || size % sizeof(capnp::word) != 0)
    return caf::make_error(wire_errc::malformed, std::string{record} + ": " + std::to_string(size) +
                                                     " bytes is not a whole number of 8-byte words");
  if (size > max_message_bytes)
    return caf::make_error(wire_errc::too_large, std::string{record} + ": " + std::to_string(size) + " bytes");
  // Copy into word-aligned storage: a std::vector<char> carries no alignment guarantee
  // that Cap'n Proto's flat reader may rely on.
  auto words = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  std::memcpy(words.begin(), data, size);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = words.size() * 4 + 1024;  // bounds amplification
  options.nestingLimit = 16;
  try {
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    if (reader.getEnd() != words.end())
      return caf::make_error(wire_errc::malformed, std::string{record} + ": trailing bytes after the message");
    auto root = reader.getRoot<Root>();
    if (auto err = check_schema(record, root.getSchemaVersion()))
      return err;
    return read(root);
  } catch (const kj::Exception& e) {
    return caf::make_error(wire_errc::malformed, std::string{record} + ": " + std::string(e.getDescription().cStr()));
  }
}

template <class Enum>
bool enum_in_range(Enum x, Enum last) {
  return static_cast<uint16_t>(x) <= static_cast<uint16_t>(last);
}

/// A trajectory's per-token lists agree (an error saying how they do not, else none).
caf::error check_lengths(const trajectory& x);
/// Writes a checked trajectory (check_lengths) into a Trajectory.
void write_trajectory(wire::Trajectory::Builder root, const trajectory& x);
/// Reads and checks a Trajectory.
caf::expected<trajectory> read_trajectory(wire::Trajectory::Reader r);

}  // namespace areal::codec_detail
