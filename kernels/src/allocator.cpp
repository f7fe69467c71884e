#include "areal/kernels/allocator.hpp"

#include <malloc.h>

namespace areal::kernels {

std::string tune_allocator() {
  // No mmap'd blocks at all (mallopt cannot raise the mmap threshold above
  // 32 MiB, and activations are often larger), and no trimming below 1 GiB free.
  bool ok = mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return ok ? "glibc malloc: heap only (no mmap blocks), trim above 1 GiB" : "glibc malloc: defaults (mallopt refused)";
}

}  // namespace areal::kernels
