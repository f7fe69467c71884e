// The chunk checksum taken apart for a GPU (kernels/src/cuda/xxh3_lanes.cuh):
// the two passes, run here on the host exactly as the CUDA kernels order them,
// give XXH3-64 of every chunk, bit for bit.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "xxh3_lanes.cuh"

namespace xxh3 = areal::xxh3;

namespace {

// The version's bytes in 8-byte words (the alignment the GPU's buffers have).
struct version_bytes {
  std::vector<uint64_t> words;
  uint64_t size = 0;

  version_bytes(uint64_t bytes, uint32_t seed) : words((bytes + 7) / 8), size(bytes) {
    std::mt19937_64 rng(seed);
    for (auto& w : words)
      w = rng();
  }
  const unsigned char* data() const { return reinterpret_cast<const unsigned char*>(words.data()); }
};

// Every chunk's checksum by the two passes (chunks of 240 bytes or less: 0, as the kernels leave them).
std::vector<uint64_t> two_pass_sums(const version_bytes& v, uint64_t chunk_bytes) {
  xxh3::chunk_layout layout{v.size, chunk_bytes};
  auto* secret = XXH3_kSecret;
  std::vector<uint64_t> block_sums(layout.chunks() * layout.blocks_per_chunk() * xxh3::lanes + 1);
  for (uint64_t c = 0; c < layout.chunks(); ++c)
    for (uint64_t b = 0; b < layout.blocks_per_chunk(); ++b)
      for (int lane = 0; lane < xxh3::lanes; ++lane)
        xxh3::block_sum(layout, v.words.data(), secret, block_sums.data(), c, b, lane);
  std::vector<uint64_t> sums(layout.chunks());
  for (uint64_t c = 0; c < layout.chunks(); ++c) {
    if (!layout.long_chunk(c))
      continue;
    uint64_t acc[xxh3::lanes];
    for (int lane = 0; lane < xxh3::lanes; ++lane)
      acc[lane] = xxh3::chunk_lane(layout, v.words.data(), secret, block_sums.data(), c, lane);
    sums[c] = xxh3::merge_lanes(acc, secret, layout.size(c));
  }
  return sums;
}

void check_against_xxh3(const version_bytes& v, uint64_t chunk_bytes) {
  CAPTURE(v.size);
  CAPTURE(chunk_bytes);
  auto sums = two_pass_sums(v, chunk_bytes);
  xxh3::chunk_layout layout{v.size, chunk_bytes};
  REQUIRE(sums.size() == (v.size + chunk_bytes - 1) / chunk_bytes);
  for (uint64_t c = 0; c < sums.size(); ++c) {
    CAPTURE(c);
    auto size = layout.size(c);
    if (size <= xxh3::short_input_max)
      CHECK_FALSE(layout.long_chunk(c));
    else
      CHECK(sums[c] == XXH3_64bits(v.data() + c * chunk_bytes, size));
  }
}

}  // namespace

TEST_CASE("the chunk checksum's two passes for a GPU give XXH3-64 of every chunk, at every length class") {
  // One chunk: lengths around the block (1,024) and stripe (64) edges, the shortest long input (241)
  // and lengths that leave the final stripe unaligned.
  for (uint64_t size : {241ULL, 242ULL, 255ULL, 256ULL, 320ULL, 1000ULL, 1023ULL, 1024ULL, 1025ULL, 1026ULL, 1087ULL,
                        1088ULL, 2047ULL, 2048ULL, 2049ULL, 3000ULL, 16384ULL, 65536ULL + 6ULL})
    check_against_xxh3(version_bytes(size, static_cast<uint32_t>(size)), 1 << 20);
  // Random lengths, even (the weights are 2- or 4-byte elements) and odd.
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    uint64_t size = 241 + rng() % 70000;
    check_against_xxh3(version_bytes(size, static_cast<uint32_t>(i)), 1 << 20);
  }
}

TEST_CASE("the chunk checksum's two passes hash every chunk of a version where the chunks lie") {
  // Several chunks; the last one long, short (240 bytes or less: left to the host) or full.
  version_bytes v((uint64_t{3} << 20) + 4096 + 10, 11);
  check_against_xxh3(v, uint64_t{1} << 20);  // three full chunks and a tail of 4,106 bytes
  check_against_xxh3(v, 4096);
  check_against_xxh3(v, 1000);  // chunks that are not whole blocks (a multiple of 8, as the kernels need)
  check_against_xxh3(version_bytes(3 * 4096, 12), 4096);
  check_against_xxh3(version_bytes(2 * 4096 + 200, 13), 4096);  // a last chunk of 200 bytes
  // The real chunk size (4 MiB) with a tail.
  check_against_xxh3(version_bytes((uint64_t{4} << 20) * 2 + 777 * 2, 14), uint64_t{4} << 20);
}
