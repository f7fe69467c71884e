// How many threads the calling thread's products use, and ending its idle
// OpenMP workers.
//
// Use set_compute_threads, never at::set_num_threads, on a compute thread.
// LibTorch 1.13's at::set_num_threads also rebuilds its global pthreadpool
// (used only by the quantized and mobile kernels) on every call, equal count or
// not: a new worker thread each time, which then spins. Measured here: 5-9 ms
// of CPU per call; the rollout worker called it every decode step. The count
// OpenMP regions (LibTorch's parallel_for, OpenBLAS's openmp build) use is a
// per-thread setting, which this sets and nothing else.
//
// Every thread that runs a parallel region keeps its own pool of OpenMP
// workers. libgomp counts the workers of every pool in the process, idle or
// not, and once they outnumber the CPUs each waiting worker spins 100 times
// instead of 300,000 before it sleeps: every parallel region then starts with
// a futex wake. One idle two-thread pool on another thread made the engine's
// decode steps 1.8-2x slower (the demo model on 2 cores, the same steps timed
// with and without it, 1.89-2.09 s against 1.06-1.08 s). release_compute_threads
// ends a thread's workers; who calls it, and when, is compute_share.hpp's.
#pragma once

namespace areal::kernels {

/// Sets the calling thread's intra-op threads to `threads` (at least 1); a no-op
/// when it has that count already.
void set_compute_threads(int threads);

/// Ends the calling thread's idle OpenMP workers, so that they no longer count
/// against the other compute threads' pools; its next parallel region starts
/// them again (tens of microseconds). A no-op inside a parallel region or when
/// the thread has no workers.
void release_compute_threads();

/// Whether the decode step's loops (its products over packed weights, decode
/// attention) let a thread done with its share take items from another's
/// (on, the default; cpu_balanced.hpp says why) or split them evenly and wait
/// for the slowest thread. Process-wide; for benchmarks that compare the two.
void set_balanced_loops(bool on);

}  // namespace areal::kernels
