// Process-wide memory allocator settings for LibTorch work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace areal::kernels {

/// Keeps freed memory in glibc's heap instead of returning large blocks to the
/// kernel after every use. LibTorch on CPU allocates and frees activation
/// tensors of many megabytes each step; with glibc's defaults each such block
/// is a fresh mmap (page faults on every touch) and an munmap. Measured on this
/// machine, SFT steps of the 24 M preset (8 x 256 tokens, 2 threads): 330
/// tokens/s with the defaults, 528 with these settings (and 622 with the
/// GLIBC_TUNABLES mmap_threshold raised to 4 GiB, which mallopt cannot do; 300
/// with jemalloc preloaded). The cost: the process keeps its peak heap.
/// Two arenas (M_ARENA_MAX): with glibc's default of an arena per thread (up to
/// 8 per core) the job's threads kept touching fresh pages: bench_async_vs_sync
/// --quick --workload long-tail (small preset, 9 jobs) made 7.3 M minor page
/// faults and spent 129 s of system CPU against 243 s of user (strace: 1,278
/// munmap calls, 1.8 s inside them); its synchronous run trained 37 tokens/s.
/// With two arenas, two runs: 4.6 and 3.9 M faults, 33 and 50 s system against
/// 249 and 232 s user, 107 and 104 tokens/s (one arena: 3.1 M, 27 s, 120 tokens/s, but the demo's RL phase, whose
/// rollout and trainer threads allocate at once, ran 40-42 s against 34 s; with
/// two 35-36 s). A 64 MiB top pad (no thread heap unmapped when empty) and no
/// trimming at all each left the faults as they were: the pages came from
/// requests larger than a thread heap, below.
/// LibTorch's CPU tensors of 4 MiB and more come from areal's own blocks
/// (mmap'd at 2 MiB boundaries with transparent huge pages advised), kept when
/// freed and handed to the next request of up to their size (a request takes
/// no block more than twice its size); kept blocks are unmapped, oldest first,
/// only when a new block would bring the mapped bytes over the most ever in use
/// at once (or 2 GiB, if that is less). glibc gives a thread arena's requests
/// over its 64 MiB heap a fresh mmap each time, whatever M_MMAP_MAX says, so
/// the trainer's optimizer temporaries and the weight snapshots of the `small`
/// preset (94 MB) were page-faulted in on every step; see the README.
/// Call once, early in main (again: no effect).
/// Returns a description of what was set, for the benchmarks' fact lines.
std::string tune_allocator();

/// The large-block cache so far: blocks mapped, requests served by a kept
/// block, and bytes kept free.
struct large_block_counts {
  uint64_t mapped = 0, reused = 0;
  size_t free_bytes = 0;
};
large_block_counts large_blocks();

}  // namespace areal::kernels
