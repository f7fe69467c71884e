// XXH3-64 of inputs longer than 240 bytes (the weight chunks' checksum, actors/src/chunk_checksum.cpp)
// taken apart so that a GPU computes it in two parallel passes: the same
// function, bit for bit, not another hash.
//
// XXH3 keeps eight 64-bit lanes. Each 64-byte stripe adds to every lane a
// value of the stripe's bytes and the secret alone (lane i gets word i ^ 1,
// plus the 32 x 32-bit product of the halves of word i xor a secret word), so
// the sixteen stripes of a 1,024-byte block add one sum per lane that does not
// depend on the lanes: pass one computes those sums for every block at once.
// After each block the lanes are scrambled (shift, xor, multiply: not
// additive), one lane independent of the others: pass two runs each lane's
// chain over its chunk's blocks, then the tail (the last partial block and the
// final stripe) and the merge of the eight lanes. Inputs of 240 bytes or less
// take XXH3's other algorithms; callers hash those on the host.
//
// Compiled by the host compiler (the tests check every step against xxHash)
// and by nvcc (chunk_checksums.cu), so: plain arithmetic, no library.
// The secret is XXH3's default one (192 bytes), which callers take from
// xxhash.h; inputs and secret are read as little-endian words.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define AREAL_XXH3_FN __host__ __device__ inline
#else
#define AREAL_XXH3_FN inline
#endif

namespace areal::xxh3 {

constexpr uint64_t stripe_bytes = 64;
constexpr uint64_t block_stripes = 16;  // (secret_bytes - stripe_bytes) / 8
constexpr uint64_t block_bytes = stripe_bytes * block_stripes;
constexpr uint64_t secret_bytes = 192;
constexpr uint64_t short_input_max = 240;  // inputs up to this size take other algorithms
constexpr int lanes = 8;

/// A little-endian 64-bit word at any alignment (the final stripe and some secret words are not aligned).
AREAL_XXH3_FN uint64_t read_word(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

/// The lane's starting value.
AREAL_XXH3_FN uint64_t initial_lane(int lane) {
  constexpr uint64_t init[lanes] = {0xC2B2AE3DULL,         0x9E3779B185EBCA87ULL, 0xC2B2AE3D27D4EB4FULL,
                                    0x165667B19E3779F9ULL, 0x85EBCA77C2B2AE63ULL, 0x85EBCA77ULL,
                                    0x27D4EB2F165667C5ULL, 0x9E3779B1ULL};
  return init[lane];
}

/// What `stripes` stripes at `words` (8-byte aligned: word w of stripe s is words[8 s + w]) add to the
/// lane, stripe s read with the secret's words from byte 8 s.
AREAL_XXH3_FN uint64_t lane_sum(const uint64_t* words, const unsigned char* secret, int lane, uint64_t stripes) {
  uint64_t sum = 0;
  for (uint64_t s = 0; s < stripes; ++s) {
    uint64_t key = words[8 * s + lane] ^ read_word(secret + 8 * s + 8 * lane);
    sum += words[8 * s + (lane ^ 1)] + (key & 0xFFFFFFFFULL) * (key >> 32);
  }
  return sum;
}

/// The same for one stripe at any alignment, read with the secret from byte `secret_offset`.
AREAL_XXH3_FN uint64_t lane_sum_unaligned(const unsigned char* stripe, const unsigned char* secret,
                                          uint64_t secret_offset, int lane) {
  uint64_t key = read_word(stripe + 8 * lane) ^ read_word(secret + secret_offset + 8 * lane);
  return read_word(stripe + 8 * (lane ^ 1)) + (key & 0xFFFFFFFFULL) * (key >> 32);
}

/// The scramble after each full block, with the lane's word of the secret's last stripe.
AREAL_XXH3_FN uint64_t scramble_lane(uint64_t acc, uint64_t key) {
  acc ^= acc >> 47;
  acc ^= key;
  return acc * 0x9E3779B1ULL;
}

/// The full blocks of an input of `size` bytes (> 240): each is added and scrambled. The block holding
/// the last byte counts as the partial block even when it is full.
AREAL_XXH3_FN uint64_t full_blocks(uint64_t size) {
  return (size - 1) / block_bytes;
}

/// The lane after its full blocks, given their sums (block_sums[b * stride] for block b). The sums are
/// read eight at a time ahead of the scrambles that wait for them (on a GPU: eight loads in flight).
AREAL_XXH3_FN uint64_t chain_lane(const uint64_t* block_sums, uint64_t stride, uint64_t blocks,
                                  const unsigned char* secret, int lane) {
  uint64_t key = read_word(secret + secret_bytes - stripe_bytes + 8 * lane);
  uint64_t acc = initial_lane(lane);
  constexpr uint64_t ahead = 8;
  uint64_t b = 0;
  for (; b + ahead <= blocks; b += ahead) {
    uint64_t sums[ahead];
    for (uint64_t k = 0; k < ahead; ++k)
      sums[k] = block_sums[(b + k) * stride];
    for (uint64_t k = 0; k < ahead; ++k)
      acc = scramble_lane(acc + sums[k], key);
  }
  for (; b < blocks; ++b)
    acc = scramble_lane(acc + block_sums[b * stride], key);
  return acc;
}

/// The lane after the tail of the input at `words` (8-byte aligned) of `size` bytes: the stripes of the
/// partial block, then the final 64 bytes of the input (overlapping them) with the secret from byte 121.
AREAL_XXH3_FN uint64_t tail_lane(uint64_t acc, const uint64_t* words, uint64_t size, const unsigned char* secret,
                                 int lane) {
  uint64_t blocks = full_blocks(size);
  uint64_t stripes = ((size - 1) - block_bytes * blocks) / stripe_bytes;
  acc += lane_sum(words + blocks * (block_bytes / 8), secret, lane, stripes);
  auto* bytes = reinterpret_cast<const unsigned char*>(words);
  return acc + lane_sum_unaligned(bytes + size - stripe_bytes, secret, secret_bytes - stripe_bytes - 7, lane);
}

/// The high and low halves of a 64 x 64-bit product, folded by xor.
AREAL_XXH3_FN uint64_t fold_product(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  __extension__ typedef unsigned __int128 wide;  // GCC's and Clang's 128-bit integer
  wide p = static_cast<wide>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}

/// The hash of an input of `size` bytes from its eight lanes.
AREAL_XXH3_FN uint64_t merge_lanes(const uint64_t* acc, const unsigned char* secret, uint64_t size) {
  uint64_t h = size * 0x9E3779B185EBCA87ULL;
  for (int i = 0; i < lanes / 2; ++i)
    h += fold_product(acc[2 * i] ^ read_word(secret + 11 + 16 * i), acc[2 * i + 1] ^ read_word(secret + 19 + 16 * i));
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}

/// A version's bytes cut into chunks of `chunk_bytes` (the last may be shorter), as the two passes see
/// them: pass one fills block_sums[(chunk * blocks_per_chunk + block) * 8 + lane].
struct chunk_layout {
  uint64_t total = 0;
  uint64_t chunk_bytes = 0;

  AREAL_XXH3_FN uint64_t chunks() const { return (total + chunk_bytes - 1) / chunk_bytes; }
  AREAL_XXH3_FN uint64_t size(uint64_t chunk) const {
    uint64_t first = chunk * chunk_bytes;
    return total - first < chunk_bytes ? total - first : chunk_bytes;
  }
  /// Full blocks of a whole chunk (no chunk has more).
  AREAL_XXH3_FN uint64_t blocks_per_chunk() const {
    return chunk_bytes > short_input_max ? full_blocks(chunk_bytes) : 0;
  }
  /// Whether the two passes hash this chunk (else it is 240 bytes or less).
  AREAL_XXH3_FN bool long_chunk(uint64_t chunk) const { return size(chunk) > short_input_max; }
};

/// Pass one, one (chunk, block, lane): the block's sum for the lane, when the block is one of the
/// chunk's full blocks. `words` is the whole version (8-byte aligned; chunk_bytes a multiple of 8).
AREAL_XXH3_FN void block_sum(const chunk_layout& layout, const uint64_t* words, const unsigned char* secret,
                             uint64_t* block_sums, uint64_t chunk, uint64_t block, int lane) {
  if (!layout.long_chunk(chunk) || block >= full_blocks(layout.size(chunk)))
    return;
  const uint64_t* data = words + (chunk * layout.chunk_bytes + block * block_bytes) / 8;
  block_sums[(chunk * layout.blocks_per_chunk() + block) * lanes + lane] = lane_sum(data, secret, lane, block_stripes);
}

/// Pass two, one (chunk, lane): the lane's final value, to be merged with the chunk's other seven.
AREAL_XXH3_FN uint64_t chunk_lane(const chunk_layout& layout, const uint64_t* words, const unsigned char* secret,
                                  const uint64_t* block_sums, uint64_t chunk, int lane) {
  uint64_t size = layout.size(chunk);
  const uint64_t* sums = block_sums + chunk * layout.blocks_per_chunk() * lanes + lane;
  uint64_t acc = chain_lane(sums, lanes, full_blocks(size), secret, lane);
  return tail_lane(acc, words + chunk * layout.chunk_bytes / 8, size, secret, lane);
}

}  // namespace areal::xxh3
