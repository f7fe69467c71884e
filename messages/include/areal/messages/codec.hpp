// Encoding of records to Cap'n Proto bytes and back. Decoding treats its input
// as untrusted: malformed, truncated or inconsistent bytes give an error
// (wire_errc), never a crash, and reading is bounded by traversal limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

#include "areal/messages/records.hpp"

namespace areal {

/// Errors of the wire format.
enum class wire_errc : uint8_t {
  /// Not a Cap'n Proto message (bad segment table, bad pointers, size not a multiple of 8).
  malformed = 1,
  /// Written under another schema version: run the same areal build everywhere.
  schema_mismatch,
  /// Well-formed but violating a record's rules (e.g. per-token lists of different lengths).
  invalid_record,
  /// Larger than one message may be (see max_message_bytes): chunk the payload.
  too_large,
};
const char* to_string(wire_errc x);

/// Largest encoded record: CAF 0.17's wire length field is 32-bit, and bulk
/// data (weights) travels through the transport layer, not as records.
inline constexpr size_t max_message_bytes = size_t{1} << 30;

/// Returns "category: code: detail" for areal's errors, CAF's rendering otherwise.
std::string describe(const caf::error& err);

caf::expected<std::vector<char>> encode(const generation_request& x);
caf::expected<std::vector<char>> encode(const trajectory& x);
caf::expected<std::vector<char>> encode(const weight_manifest& x);
caf::expected<std::vector<char>> encode(const reward_task& x);
caf::expected<std::vector<char>> encode(const node_hello& x);
caf::expected<std::vector<char>> encode(const node_stats& x);
caf::expected<std::vector<char>> encode(const run_state& x);

/// decode<T>(bytes): the record, or an error saying what is wrong with the bytes.
template <class T>
caf::expected<T> decode(const char* data, size_t size);

template <class T>
caf::expected<T> decode(const std::vector<char>& bytes) {
  return decode<T>(bytes.data(), bytes.size());
}

/// XXH64 (seed 0) of a byte range: the checksum used by manifests and acknowledgements.
uint64_t checksum(const void* data, size_t size);

/// Checks a manifest's own consistency: every tensor inside total_bytes, sizes
/// matching dtype x shape, no overlaps, unique names, non-negative dimensions.
caf::error validate(const weight_manifest& x);

}  // namespace areal

CAF_ERROR_CODE_ENUM(areal::wire_errc, "wire")
