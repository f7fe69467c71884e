// How many threads the calling thread's products use.
//
// Use set_compute_threads, never at::set_num_threads, on a compute thread.
// LibTorch 1.13's at::set_num_threads also rebuilds its global pthreadpool
// (used only by the quantized and mobile kernels) on every call, equal count or
// not: a new worker thread each time, which then spins. Measured here: 5-9 ms
// of CPU per call; the rollout worker called it every decode step. The count
// OpenMP regions (LibTorch's parallel_for, OpenBLAS's openmp build) use is a
// per-thread setting, which this sets and nothing else.
#pragma once

namespace areal::kernels {

/// Sets the calling thread's intra-op threads to `threads` (at least 1); a no-op
/// when it has that count already.
void set_compute_threads(int threads);

}  // namespace areal::kernels
