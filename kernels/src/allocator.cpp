#include "areal/kernels/allocator.hpp"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "torch_compat.hpp"

namespace areal::kernels {

namespace {

constexpr size_t huge_page = size_t{2} << 20;

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

// Large blocks, kept when freed and handed out again. glibc serves a request
// larger than a thread arena's 64 MiB heap with a fresh mmap whatever
// M_MMAP_MAX says, and unmaps it when it is freed: every optimizer step of the
// `small` preset (94 MB parameters) then faulted in its temporaries page by page.
class block_cache {
 public:
  // Blocks from this size up are cached; smaller ones go to the allocator before.
  static constexpr size_t threshold = size_t{4} << 20;
  // Mapped bytes (blocks in use and kept) at most: the most ever in use at
  // once, or 2 GiB if that is less. A new block over it unmaps kept ones,
  // oldest first.
  static constexpr size_t min_limit = size_t{2} << 30;

  void* take(size_t n) {
    auto size = round_up(n, huge_page);
    std::vector<block> unmap;
    {
      std::lock_guard lock(mutex_);
      // The smallest kept block that fits and is at most twice the size (no large block lent for a small request).
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->size >= size && it->size <= 2 * size && (best == free_.end() || it->size < best->size))
          best = it;
      if (best != free_.end()) {
        auto b = *best;
        free_.erase(best);
        in_use_ += b.size;
        peak_ = std::max(peak_, in_use_);
        ++reused_;
        return b.data;
      }
      // A new block: make room under the limit (counting it as in use already).
      in_use_ += size;
      peak_ = std::max(peak_, in_use_);
      auto limit = std::max(min_limit, peak_);
      while (!free_.empty() && in_use_ + kept_bytes() > limit) {
        unmap.push_back(free_.front());
        sizes_.erase(free_.front().data);
        free_.erase(free_.begin());
      }
    }
    for (auto& b : unmap)
      munmap(b.data, b.size);
    void* data = map(size);
    if (!data) {
      release_free();
      data = map(size);
    }
    std::lock_guard lock(mutex_);
    if (!data) {
      in_use_ -= size;
      throw std::bad_alloc();
    }
    sizes_[data] = size;
    ++mapped_;
    return data;
  }

  // False where the block is not one of ours.
  bool give_back(void* data) {
    std::lock_guard lock(mutex_);
    auto it = sizes_.find(data);
    if (it == sizes_.end())
      return false;
    free_.push_back({data, it->second});
    in_use_ -= it->second;
    return true;
  }

  large_block_counts counts() {
    std::lock_guard lock(mutex_);
    return {mapped_, reused_, kept_bytes()};
  }

  static block_cache& instance() {
    static auto* cache = new block_cache;  // never destroyed: tensors may outlive static destructors
    return *cache;
  }

 private:
  struct block {
    void* data;
    size_t size;
  };

  size_t kept_bytes() const {
    size_t bytes = 0;
    for (auto& b : free_)
      bytes += b.size;
    return bytes;
  }

  // size bytes at a huge-page boundary, marked for transparent huge pages
  // (one fault per 2 MiB where the kernel allows them; madvise failing changes nothing else).
  static void* map(size_t size) {
    auto span = size + huge_page;
    void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
      return nullptr;
    auto start = reinterpret_cast<uintptr_t>(raw);
    auto aligned = round_up(start, huge_page);
    if (aligned > start)
      munmap(raw, aligned - start);
    auto tail = start + span - (aligned + size);
    if (tail > 0)
      munmap(reinterpret_cast<void*>(aligned + size), tail);
    auto* data = reinterpret_cast<void*>(aligned);
    madvise(data, size, MADV_HUGEPAGE);
    return data;
  }

  void release_free() {
    std::lock_guard lock(mutex_);
    for (auto& b : free_) {
      munmap(b.data, b.size);
      sizes_.erase(b.data);
    }
    free_.clear();
  }

  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;  // every mapped block
  std::vector<block> free_;                  // kept blocks, oldest first
  size_t in_use_ = 0, peak_ = 0;
  uint64_t mapped_ = 0, reused_ = 0;
};

void give_back(void* data) {
  block_cache::instance().give_back(data);  // only our large blocks' DataPtrs carry this deleter
}

// The allocator that serves requests below the threshold (LibTorch's default).
c10::Allocator* small_allocator = nullptr;

// Memory taken with raw_allocate comes back here without its DataPtr: a large
// block goes back to the cache, anything else to the allocator that made it.
void release_raw(void* data) {
  if (data && !block_cache::instance().give_back(data))
    small_allocator->raw_deleter()(data);
}

// LibTorch's CPU allocator with large blocks from the cache. LibTorch's kernels
// also take scratch memory raw (raw_allocate / raw_deallocate, e.g. a bfloat16
// product): without raw_deleter they aborted on an internal assertion.
class cpu_allocator final : public c10::Allocator {
 public:
  explicit cpu_allocator(c10::Allocator* small) : small_(small) {}

#if AREAL_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    if (n < block_cache::threshold)
      return small_->allocate(n);
    void* data = block_cache::instance().take(n);
    return {data, data, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return small_->raw_deleter() ? &release_raw : nullptr;
  }

#if AREAL_TORCH_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  c10::Allocator* small_;
};

}  // namespace

large_block_counts large_blocks() {
  return block_cache::instance().counts();
}

std::string tune_allocator() {
  // No mmap'd blocks at all (mallopt cannot raise the mmap threshold above
  // 32 MiB, and activations are often larger), no trimming below 1 GiB free,
  // and two arenas for all threads instead of up to eight per core: with an
  // arena per thread, the job's threads kept faulting fresh pages (1 arena:
  // as few faults, but the threads then wait on its lock; allocator.hpp).
  bool ok = mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && mallopt(M_ARENA_MAX, 2) == 1;
  static std::once_flag installed;
  std::call_once(installed, [] {
    small_allocator = c10::GetCPUAllocator();
    static auto* allocator = new cpu_allocator(small_allocator);  // never destroyed, as the cache
    c10::SetCPUAllocator(allocator, 1);
  });
  std::string large = "; LibTorch blocks from 4 MiB kept for reuse (huge pages advised)";
  return (ok ? "glibc malloc: heap only (no mmap blocks), trim above 1 GiB, 2 arenas"
             : "glibc malloc: defaults (mallopt refused)") +
         large;
}

}  // namespace areal::kernels
