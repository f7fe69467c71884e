#include "chunk_checksums.cuh"

#include <cuda_runtime.h>

#include <cstring>

#include "xxh3_lanes.cuh"

namespace areal::kernels::cuda_launch {

namespace {

// The secret travels by value as a launch parameter and is copied into each
// block's shared memory: no device symbol to keep per GPU.
struct secret_bytes {
  unsigned char bytes[xxh3::secret_bytes];
};

__device__ void load_secret(const secret_bytes& from, unsigned char* to) {
  for (unsigned i = threadIdx.x; i < xxh3::secret_bytes; i += blockDim.x)
    to[i] = from.bytes[i];
  __syncthreads();
}

constexpr unsigned pass_one_threads = 256;  // 32 blocks of 1,024 bytes, 8 lanes each

// Pass one: thread i is lane i % 8 of block (i / 8) % per_chunk of chunk i / (8 per_chunk).
__global__ void block_sums_kernel(xxh3::chunk_layout layout, const uint64_t* words, secret_bytes secret,
                                  uint64_t* block_sums, uint64_t threads) {
  __shared__ unsigned char key[xxh3::secret_bytes];
  load_secret(secret, key);
  uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= threads)
    return;
  uint64_t per_chunk = layout.blocks_per_chunk();
  int lane = static_cast<int>(i % xxh3::lanes);
  uint64_t block = (i / xxh3::lanes) % per_chunk;
  uint64_t chunk = i / xxh3::lanes / per_chunk;
  xxh3::block_sum(layout, words, key, block_sums, chunk, block, lane);
}

// Pass two: one block of eight threads per chunk, one per lane; the first merges them.
__global__ void chunk_sums_kernel(xxh3::chunk_layout layout, const uint64_t* words, secret_bytes secret,
                                  const uint64_t* block_sums, uint64_t* sums) {
  __shared__ unsigned char key[xxh3::secret_bytes];
  __shared__ uint64_t acc[xxh3::lanes];
  load_secret(secret, key);
  uint64_t chunk = blockIdx.x;
  if (!layout.long_chunk(chunk))
    return;  // the whole block alike: no thread is left waiting at the barrier below
  int lane = static_cast<int>(threadIdx.x);
  acc[lane] = xxh3::chunk_lane(layout, words, key, block_sums, chunk, lane);
  __syncthreads();
  if (lane == 0)
    sums[chunk] = xxh3::merge_lanes(acc, key, layout.size(chunk));
}

}  // namespace

uint64_t checksum_scratch_words(uint64_t total, uint64_t chunk_bytes) {
  xxh3::chunk_layout layout{total, chunk_bytes};
  return layout.chunks() * layout.blocks_per_chunk() * xxh3::lanes;
}

void chunk_checksums(const void* data, uint64_t total, uint64_t chunk_bytes, const unsigned char* secret,
                     uint64_t* scratch, uint64_t* sums, cudaStream_t stream) {
  xxh3::chunk_layout layout{total, chunk_bytes};
  if (total == 0)
    return;
  secret_bytes key;
  std::memcpy(key.bytes, secret, sizeof(key.bytes));
  auto* words = static_cast<const uint64_t*>(data);
  uint64_t threads = checksum_scratch_words(total, chunk_bytes);
  if (threads > 0) {
    auto blocks = static_cast<unsigned>((threads + pass_one_threads - 1) / pass_one_threads);
    block_sums_kernel<<<blocks, pass_one_threads, 0, stream>>>(layout, words, key, scratch, threads);
  }
  chunk_sums_kernel<<<static_cast<unsigned>(layout.chunks()), xxh3::lanes, 0, stream>>>(layout, words, key, scratch,
                                                                                        sums);
}

}  // namespace areal::kernels::cuda_launch
