// One Cap'n Proto record decoder (compiled once per record type, named by
// AREAL_FUZZ_RECORD). Decoding untrusted bytes gives a record or an error;
// a decoded record always encodes again and decodes to itself.
#include <cstdint>

#include "areal/messages/codec.hpp"

using record = areal::AREAL_FUZZ_RECORD;

namespace {
template <class T>
void check_further(const T&) {}
// A manifest is also checked for its own consistency (what a subscriber does next).
void check_further(const areal::weight_manifest& m) {
  (void)areal::validate(m);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto decoded = areal::decode<record>(reinterpret_cast<const char*>(data), size);
  if (!decoded) {
    if (areal::describe(decoded.error()).empty())
      __builtin_trap();
    return 0;
  }
  auto bytes = areal::encode(*decoded);
  if (!bytes)
    __builtin_trap();  // what was accepted is a valid record
  auto again = areal::decode<record>(*bytes);
  if (!again || !(*again == *decoded))
    __builtin_trap();
  check_further(*decoded);
  return 0;
}
