// CAF carriers of encoded records. A packed<T> holds the Cap'n Proto bytes of
// one T: CAF serializes std::vector<char> with a single copy, and inside one
// process the bytes move without serialization at all. The type IDs of all
// carriers are assigned in the one type-ID block in areal/actors/interfaces.hpp.
#pragma once

#include <utility>
#include <vector>

#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>

#include "areal/messages/codec.hpp"

namespace areal {

template <class Record>
struct packed {
  std::vector<char> bytes;
};

template <class Record>
bool operator==(const packed<Record>& a, const packed<Record>& b) {
  return a.bytes == b.bytes;
}

/// Encodes a record into its carrier.
template <class Record>
caf::expected<packed<Record>> pack(const Record& x) {
  auto bytes = encode(x);
  if (!bytes)
    return std::move(bytes.error());
  return packed<Record>{std::move(*bytes)};
}

/// Decodes a carrier; the bytes may come from an untrusted peer.
template <class Record>
caf::expected<Record> unpack(const packed<Record>& x) {
  return decode<Record>(x.bytes);
}

template <class Record>
const char* packed_type_name();
template <>
inline const char* packed_type_name<generation_request>() {
  return "areal.generation_request";
}
template <>
inline const char* packed_type_name<trajectory>() {
  return "areal.trajectory";
}
template <>
inline const char* packed_type_name<weight_manifest>() {
  return "areal.weight_manifest";
}
template <>
inline const char* packed_type_name<reward_task>() {
  return "areal.reward_task";
}
template <>
inline const char* packed_type_name<node_hello>() {
  return "areal.node_hello";
}
template <>
inline const char* packed_type_name<node_stats>() {
  return "areal.node_stats";
}

template <class Inspector, class Record>
typename Inspector::result_type inspect(Inspector& f, packed<Record>& x) {
  return f(caf::meta::type_name(packed_type_name<Record>()), x.bytes);
}

}  // namespace areal
