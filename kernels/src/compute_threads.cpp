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

void release_compute_threads() {
  if (omp_in_parallel())
    return;
  // libgomp ends the calling thread's pool (its workers exit, and its count of
  // managed threads drops by as many); soft: the next region starts a new one.
  omp_pause_resource(omp_pause_soft, omp_get_initial_device());
}

}  // namespace areal::kernels
