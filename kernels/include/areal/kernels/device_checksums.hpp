// The weight chunks' checksums on a GPU: XXH3-64 of each chunk, the checksum
// the weight links compute on the host (actors' chunk_checksum), computed where
// a version lies, so that a version sent from or received into GPU memory is
// checked without a copy to the host. cuda/xxh3_lanes.cuh has the algorithm.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace areal::kernels {

/// XXH3-64 of each chunk of `bytes` (a contiguous one-dimensional uint8 tensor on a CUDA device) in
/// chunks of `chunk_bytes` (the last one shorter), as int64 [chunks] on the same device (the sums'
/// bits). Throws std::invalid_argument for bytes elsewhere and std::runtime_error in a build without
/// the kernels.
at::Tensor chunk_checksums_on_device(const at::Tensor& bytes, uint64_t chunk_bytes);

}  // namespace areal::kernels
