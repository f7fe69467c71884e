// Fuzz-style robustness: random buffers, truncations and bit flips of valid
// encodings, for every record type. Decoding must return (a record or an
// error) every time; build with -DAREAL_SANITIZE=address,undefined to have
// AddressSanitizer watch the same loop.
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "areal/messages/codec.hpp"
#include "sample_records.hpp"

using namespace areal;

namespace {

struct tally {
  size_t decoded = 0;
  size_t refused = 0;
};

template <class T>
void feed(const std::vector<char>& bytes, tally& t) {
  auto result = decode<T>(bytes);
  if (result) {
    ++t.decoded;
    // Whatever decodes must encode again: a decoded record is always consistent.
    CHECK(encode(*result));
  } else {
    ++t.refused;
    CHECK_FALSE(describe(result.error()).empty());
  }
}

template <class T>
tally fuzz(const T& sample, uint32_t seed) {
  std::mt19937 rng{seed};
  tally t;
  auto valid = *encode(sample);
  // Every truncation to whole words, and every odd size near the end.
  for (size_t n = 0; n < valid.size(); ++n)
    feed<T>(std::vector<char>(valid.begin(), valid.begin() + static_cast<long>(n)), t);
  // Bit flips and random word overwrites of the valid encoding.
  std::uniform_int_distribution<size_t> pos(0, valid.size() - 1);
  std::uniform_int_distribution<int> bit(0, 7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 3000; ++i) {
    auto mutated = valid;
    int flips = 1 + i % 4;
    for (int f = 0; f < flips; ++f)
      mutated[pos(rng)] ^= static_cast<char>(1 << bit(rng));
    if (i % 3 == 0)
      for (int k = 0; k < 8; ++k)
        mutated[(pos(rng) & ~size_t{7}) + static_cast<size_t>(k) % valid.size()] = static_cast<char>(byte(rng));
    feed<T>(mutated, t);
  }
  // Pure noise of word-multiple sizes, including huge claimed segment sizes.
  std::uniform_int_distribution<size_t> words(1, 64);
  for (int i = 0; i < 2000; ++i) {
    std::vector<char> noise(words(rng) * 8);
    for (auto& c : noise)
      c = static_cast<char>(byte(rng));
    if (i % 4 == 0)
      std::fill(noise.begin(), noise.begin() + 4, 0);  // "one segment", random size
    feed<T>(noise, t);
  }
  return t;
}

}  // namespace

TEST_CASE("random and truncated and corrupted bytes never crash the decoders") {
  auto check = [](const std::string& name, tally t) {
    INFO(name);
    CHECK(t.refused > 0);
    MESSAGE(name << ": " << t.decoded << " decoded, " << t.refused << " refused");
  };
  check("generation_request", fuzz(test::sample_request(), 1));
  check("trajectory", fuzz(test::sample_trajectory(), 2));
  check("weight_manifest", fuzz(test::sample_manifest(), 3));
  check("reward_task", fuzz(test::sample_task(), 6));
  check("node_hello", fuzz(test::sample_hello(), 4));
  check("node_stats", fuzz(test::sample_stats(), 5));
  check("run_state", fuzz(test::sample_run_state(), 7));
}

TEST_CASE("a list claiming more elements than the message holds is refused") {
  // A valid trajectory whose prompt list pointer claims 2^29 elements.
  auto bytes = *encode(test::sample_trajectory());
  bool patched = false;
  // List pointers have low two bits 01; element count is in the upper 29 bits.
  for (size_t off = 8; off + 8 <= bytes.size() && !patched; off += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + off, 8);
    if ((word & 3) == 1 && ((word >> 32) & 7) == 4) {  // list of 32-bit elements
      word = (word & 0xffffffffULL) | (uint64_t{4} << 32) | (uint64_t{(1u << 29) - 1} << 35);
      std::memcpy(bytes.data() + off, &word, 8);
      patched = true;
    }
  }
  REQUIRE(patched);
  auto back = decode<trajectory>(bytes);
  REQUIRE_FALSE(back);
  CHECK(describe(back.error()).find("malformed") != std::string::npos);
}
