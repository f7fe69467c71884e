#include "areal/kernels/allocator.hpp"

#include <malloc.h>

namespace areal::kernels {

std::string tune_allocator() {
  // No mmap'd blocks at all (mallopt cannot raise the mmap threshold above
  // 32 MiB, and activations are often larger), no trimming below 1 GiB free,
  // and two arenas for all threads instead of up to eight per core: with an
  // arena per thread, the job's threads kept faulting fresh pages (1 arena:
  // as few faults, but the threads then wait on its lock; allocator.hpp).
  bool ok = mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && mallopt(M_ARENA_MAX, 2) == 1;
  return ok ? "glibc malloc: heap only (no mmap blocks), trim above 1 GiB, 2 arenas"
            : "glibc malloc: defaults (mallopt refused)";
}

}  // namespace areal::kernels
