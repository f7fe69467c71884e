// Process-wide memory allocator settings for LibTorch work.
#pragma once

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
/// Call once, early in main.
/// Returns a description of what was set, for the benchmarks' fact lines.
std::string tune_allocator();

}  // namespace areal::kernels
