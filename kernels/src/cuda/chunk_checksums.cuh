// The weight chunks' checksums (XXH3-64) computed on the GPU where a version
// lies (xxh3_lanes.cuh has the algorithm), with a plain interface: nvcc compiles
// chunk_checksums.cu without LibTorch's headers; device_checksums.cpp is the
// ATen side.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace areal::kernels::cuda_launch {

/// The scratch the two passes need, in 64-bit words.
uint64_t checksum_scratch_words(uint64_t total, uint64_t chunk_bytes);

/// sums[c] = XXH3-64 of chunk c of `data` (`total` bytes in chunks of `chunk_bytes`, the last one
/// shorter), for every chunk longer than 240 bytes; shorter ones are left as they are. `data` 8-byte
/// aligned, `chunk_bytes` a multiple of 8; `secret` is XXH3's default secret (192 bytes, host memory);
/// `scratch` holds checksum_scratch_words(total, chunk_bytes) words.
void chunk_checksums(const void* data, uint64_t total, uint64_t chunk_bytes, const unsigned char* secret,
                     uint64_t* scratch, uint64_t* sums, cudaStream_t stream);

}  // namespace areal::kernels::cuda_launch
