// The large-block cache behind LibTorch's CPU allocator (kernels/allocator.hpp):
// freed blocks are handed out again instead of mapped anew, a small request
// does not take a much larger block, and the blocks kept stay under the limit.
#include <ATen/ATen.h>

#include <thread>

#include <doctest/doctest.h>

#include "areal/kernels/allocator.hpp"

using namespace areal::kernels;

namespace {
constexpr int64_t mib = int64_t{1} << 20;
at::Tensor bytes(int64_t n) {
  return at::empty({n}, at::TensorOptions().dtype(at::kByte));
}
}  // namespace

TEST_CASE("a freed large tensor's block is handed to the next request of its size, on any thread") {
  tune_allocator();
  void* first = nullptr;
  {
    auto t = bytes(64 * mib);
    first = t.data_ptr();
    t.fill_(1);
  }
  auto before = large_blocks();
  CHECK(before.free_bytes >= static_cast<size_t>(64 * mib));
  void* again = nullptr;
  std::thread([&] {  // another thread (another malloc arena): the same block
    auto t = bytes(60 * mib);
    again = t.data_ptr();
    t.fill_(2);
  })
      .join();
  auto after = large_blocks();
  CHECK(again == first);
  CHECK(after.reused == before.reused + 1);
  CHECK(after.mapped == before.mapped);

  // A 5 MiB request does not take a free 64 MiB block (more than twice its size).
  auto small = bytes(5 * mib);
  CHECK(large_blocks().mapped == after.mapped + 1);
  CHECK(small.data_ptr() != first);
  // Below 4 MiB the previous allocator serves: the cache does not count it.
  auto tiny = bytes(mib);
  CHECK(large_blocks().mapped == after.mapped + 1);
}

TEST_CASE("the large blocks kept stay under 2 GiB when the most in use at once was less") {
  tune_allocator();
  // Sizes more than twice each other: none serves the next; never touched, so nothing is paged in.
  for (int64_t size : {100 * mib, 300 * mib, 700 * mib, 1500 * mib}) {
    auto t = bytes(size);
  }
  auto counts = large_blocks();
  CHECK(counts.mapped >= 4);
  CHECK(counts.free_bytes <= static_cast<size_t>(2048 * mib));
  CHECK(counts.free_bytes >= static_cast<size_t>(1500 * mib));  // the newest block is kept
}
