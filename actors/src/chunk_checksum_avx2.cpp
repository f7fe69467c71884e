// chunk_checksum compiled with AVX2 (this file alone gets -mavx2; see
// chunk_checksum.cpp, which calls it only on CPUs that have AVX2). Nothing
// else is included here: an inline function with external linkage built with
// AVX2 could be picked by the linker for every caller, on any CPU. xxHash's
// functions are static under XXH_INLINE_ALL.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace areal {

uint64_t chunk_checksum_avx2(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

}  // namespace areal
