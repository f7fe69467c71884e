// The checksum of a weight chunk in transit: XXH3-64, compiled inline
// (XXH_INLINE_ALL): Debian's shared libxxhash hashes a 4 MiB chunk at about
// 6 GB/s on this machine, the inlined XXH3 at about 24 GB/s (XXH64 inlined:
// 14 GB/s). Every chunk is hashed once on each side, on the cores the
// transfer's copies also need.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "bulk_link.hpp"

namespace areal {

#if defined(AREAL_CHUNK_CHECKSUM_AVX2)
uint64_t chunk_checksum_avx2(const void* data, size_t size);  // chunk_checksum_avx2.cpp

namespace {
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
}  // namespace
#endif

uint64_t chunk_checksum_baseline(const void* data, size_t size) {
  return XXH3_64bits(data, size);
}

uint64_t chunk_checksum(const void* data, size_t size) {
#if defined(AREAL_CHUNK_CHECKSUM_AVX2)
  if (cpu_has_avx2())
    return chunk_checksum_avx2(data, size);
#endif
  return chunk_checksum_baseline(data, size);
}

const char* chunk_checksum_kind() {
#if defined(AREAL_CHUNK_CHECKSUM_AVX2)
  if (cpu_has_avx2())
    return "XXH3-64 (AVX2)";
#endif
  return "XXH3-64 (baseline instructions)";
}

}  // namespace areal
