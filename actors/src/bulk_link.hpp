// A point-to-point link that moves one weight version in bulk between the
// publisher's node and one subscriber: the version's header (the version sent,
// or -1 when it is no longer held), then every chunk with the XXH3-64 of its
// bytes, computed by the sender as it sends (a version on a GPU: on the GPU,
// in one pass before). Implemented over Gloo
// (gloo_link.cpp) and NCCL (nccl_link.cpp, in builds that found CUDA and NCCL).
// Blocking: each side runs on a thread of its own. A link that throws is broken.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "areal/messages/records.hpp"

namespace at {
class Tensor;
}  // namespace at

namespace areal {

/// The checksum every chunk travels with: XXH3-64 of its bytes (chunk_checksum.cpp).
uint64_t chunk_checksum(const void* data, size_t size);
/// The same with baseline x86-64 instructions only (the tests compare the two).
uint64_t chunk_checksum_baseline(const void* data, size_t size);

/// The sender's checksums of one version, each computed once however many
/// links send it (two rollout nodes: half the sender's hashing): the first
/// link to reach a chunk hashes it, a link that finds it being hashed waits
/// for that (a fraction of a millisecond), later ones read it.
class chunk_sums {
 public:
  explicit chunk_sums(uint64_t count)
      : state_(new std::atomic<int>[count]()), sums_(new std::atomic<uint64_t>[count]()) {}
  /// The checksum of chunk `i`, whose bytes are `data`.
  uint64_t get(uint64_t i, const void* data, size_t size) {
    auto& state = state_[i];
    int expected = 0;
    if (state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      sums_[i].store(chunk_checksum(data, size), std::memory_order_relaxed);
      state.store(2, std::memory_order_release);
    } else {
      while (state.load(std::memory_order_acquire) != 2)
        std::this_thread::yield();
    }
    return sums_[i].load(std::memory_order_relaxed);
  }
  /// The checksum of chunk `i` if it is known already (hashed, or recorded by put).
  std::optional<uint64_t> known(uint64_t i) const {
    if (state_[i].load(std::memory_order_acquire) != 2)
      return std::nullopt;
    return sums_[i].load(std::memory_order_relaxed);
  }
  /// Records the checksum of chunk `i` computed elsewhere (on the GPU that holds the version), unless
  /// it is known or being computed already (the same value).
  void put(uint64_t i, uint64_t sum) {
    int expected = 0;
    if (state_[i].compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      sums_[i].store(sum, std::memory_order_relaxed);
      state_[i].store(2, std::memory_order_release);
    }
  }

 private:
  std::unique_ptr<std::atomic<int>[]> state_;  // 0 not hashed, 1 being hashed, 2 hashed
  std::unique_ptr<std::atomic<uint64_t>[]> sums_;
};

/// Test hook of the sender: may alter a chunk's bytes after its checksum was taken.
using chunk_tamper = std::function<void(int64_t version, uint64_t chunk, std::string& bytes)>;

/// Byte range (first, size) of chunk `i` of a version.
inline std::pair<uint64_t, uint64_t> chunk_range(const weight_manifest& m, uint64_t i) {
  auto size = m.chunk_bytes == 0 ? m.total_bytes : m.chunk_bytes;
  auto first = i * size;
  return {first, std::min(size, m.total_bytes - first)};
}

class bulk_link {
 public:
  virtual ~bulk_link() = default;
  virtual const char* backend() const = 0;
  /// Whether the link sends from and receives into GPU memory as it is (NCCL); other links are given
  /// bytes in host memory.
  virtual bool reads_device_memory() const { return false; }
  /// Sends `m.version` from `bytes` (a contiguous byte tensor) with the checksums `sums` (of
  /// m.chunk_count() chunks), or the header -1 when bytes is null. `tamper` only with bytes in host memory.
  virtual void send_version(const weight_manifest& m, const at::Tensor* bytes, chunk_sums* sums,
                            const chunk_tamper& tamper) = 0;
  /// Receives into `buffer` (m.total_bytes bytes; in GPU memory only where reads_device_memory()).
  /// False when the sender sent another version
  /// (the one asked for was replaced); damaged chunks are listed in `bad`.
  virtual bool receive_version(const weight_manifest& m, at::Tensor& buffer, std::vector<uint64_t>& bad) = 0;
};

}  // namespace areal
