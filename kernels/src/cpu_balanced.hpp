// balanced_for: a loop over [0, n) on ATen's intra-op threads that no thread
// waits on another's share.
//
// Why: at::parallel_for splits a range evenly and then waits for the last
// thread. On the machines this runs on, the cores are not equally fast: on a
// 2-vCPU AMD EPYC VM a register-only loop of fused multiply-adds ran 13-15%
// slower on vCPU 0 than on vCPU 1 (stable over minutes), and `perf` on the
// decode step (small, batch 64) found the second thread idle at the step's
// barriers for 24% of its time while the first computed. Items also differ:
// decode attention's tasks cost what their sequence's length costs.
//
// How: each thread starts on its own even share, taking `grain` items at a
// time from its front; a thread done with its share takes `grain` items at a
// time from the back of another's. A share is one atomic word (front and back),
// on its own cache line: a claim is one uncontended compare-and-swap, except
// in the last items of a share, where owner and helper meet.
#pragma once

#include <cstdint>
#include <functional>

namespace areal::kernels::cpu {

/// Calls run(begin, end, share_end) over disjoint ranges that cover [0, n) once:
/// on ATen's intra-op threads, ranges `grain` items long (the last of a share may
/// be shorter); once, for [0, n), on the calling thread alone when it has one
/// intra-op thread, is inside a parallel region, or n <= grain. share_end is
/// where the share the range was taken from ended at the time: items before it
/// are likely the same thread's next (a hint for prefetching, never an item to
/// touch). Switched off (set_balanced_loops), ranges as at::parallel_for splits.
void balanced_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int64_t)>& run);

}  // namespace areal::kernels::cpu
