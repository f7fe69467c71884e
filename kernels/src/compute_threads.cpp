#include "areal/kernels/compute_threads.hpp"

#include <omp.h>

#include <algorithm>

#include <ATen/Parallel.h>

namespace areal::kernels {

void set_compute_threads(int threads) {
  threads = std::max(1, threads);
  // at::get_num_threads first: a thread's first call to LibTorch's parallel
  // code sets its OpenMP count to the default, which would undo ours later.
  if (at::get_num_threads() != threads)
    omp_set_num_threads(threads);
}

}  // namespace areal::kernels
