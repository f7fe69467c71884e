#include "areal/kernels/device_checksums.hpp"

#include <stdexcept>
#include <string>

#if AREAL_CUDA_KERNELS
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/chunk_checksums.cuh"
#include "cuda/xxh3_lanes.cuh"
#endif

namespace areal::kernels {

#if AREAL_CUDA_KERNELS

at::Tensor chunk_checksums_on_device(const at::Tensor& bytes, uint64_t chunk_bytes) {
  if (!bytes.is_cuda() || bytes.scalar_type() != at::kByte || bytes.dim() != 1 || !bytes.is_contiguous())
    throw std::invalid_argument(
        "chunk_checksums_on_device: needs a contiguous one-dimensional uint8 tensor on a "
        "CUDA device (bytes in host memory are hashed by chunk_checksum)");
  if (chunk_bytes == 0)
    throw std::invalid_argument("chunk_checksums_on_device: chunk_bytes must be positive");
  static_assert(xxh3::secret_bytes == XXH3_SECRET_DEFAULT_SIZE, "XXH3's default secret changed size");
  uint64_t total = static_cast<uint64_t>(bytes.numel());
  xxh3::chunk_layout layout{total, chunk_bytes};
  auto address = reinterpret_cast<uintptr_t>(bytes.data_ptr());
  if (address % 8 != 0 || chunk_bytes % 8 != 0 || chunk_bytes <= xxh3::short_input_max) {
    // The passes read 8-byte words and hash chunks over 240 bytes: hash such a version on the host (a copy;
    // the weight links' buffers and chunk sizes, whole KiB, are never like it).
    auto host = bytes.cpu();
    auto out = at::empty({static_cast<int64_t>(layout.chunks())}, at::kLong);
    for (uint64_t c = 0; c < layout.chunks(); ++c)
      out[static_cast<int64_t>(c)].fill_(
          static_cast<int64_t>(XXH3_64bits(host.data_ptr<uint8_t>() + c * chunk_bytes, layout.size(c))));
    return out.to(bytes.device());
  }
  auto on = bytes.options().dtype(at::kLong);
  auto sums = at::zeros({static_cast<int64_t>(layout.chunks())}, on);
  if (total == 0)
    return sums;
  c10::cuda::CUDAGuard on_device(bytes.device());
  auto scratch = at::empty({static_cast<int64_t>(cuda_launch::checksum_scratch_words(total, chunk_bytes)) + 1}, on);
  auto stream = c10::cuda::getCurrentCUDAStream(bytes.device().index()).stream();
  cuda_launch::chunk_checksums(bytes.data_ptr(), total, chunk_bytes, XXH3_kSecret,
                               reinterpret_cast<uint64_t*>(scratch.data_ptr<int64_t>()),
                               reinterpret_cast<uint64_t*>(sums.data_ptr<int64_t>()), stream);
  auto error = cudaGetLastError();
  if (error != cudaSuccess)
    throw std::runtime_error(std::string("CUDA kernel chunk_checksums failed: ") + cudaGetErrorString(error));
  // With chunks over 240 bytes only the last one can be shorter: XXH3 takes other algorithms there; hashed on
  // the host.
  uint64_t last = layout.chunks() - 1;
  if (!layout.long_chunk(last)) {
    auto tail =
        bytes.narrow(0, static_cast<int64_t>(last * chunk_bytes), static_cast<int64_t>(layout.size(last))).cpu();
    sums[static_cast<int64_t>(last)].fill_(static_cast<int64_t>(XXH3_64bits(tail.data_ptr(), layout.size(last))));
  }
  return sums;
}

#else

at::Tensor chunk_checksums_on_device(const at::Tensor& bytes, uint64_t) {
  if (!bytes.is_cuda())
    throw std::invalid_argument(
        "chunk_checksums_on_device: needs a uint8 tensor on a CUDA device (bytes in host "
        "memory are hashed by chunk_checksum)");
  throw std::runtime_error("chunk_checksums_on_device: this build has no CUDA kernels (a LibTorch without CUDA)");
}

#endif

}  // namespace areal::kernels
