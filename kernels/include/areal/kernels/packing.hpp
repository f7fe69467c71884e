// Dynamic micro-batching: sequences of very different lengths packed, without
// padding, into micro-batches under a token budget (longest first, as the
// reference system's first-fit decreasing, each into the lightest micro-batch
// it fits), and the fixed-size padded alternative it is measured against.
#pragma once

#include <cstdint>
#include <vector>

namespace areal::kernels {

/// Sort by length, longest first; open a new micro-batch while there are fewer
/// than `min_micro_batches` or the sequence fits in none; otherwise put it into
/// the fitting micro-batch holding the fewest tokens (longest processing time
/// first: the micro-batches come out balanced in tokens). Returns indices into
/// `lengths` per micro-batch. Throws std::invalid_argument for a sequence longer
/// than `max_tokens` (it cannot be placed: raise max_tokens_per_mb or cut it).
std::vector<std::vector<size_t>> pack_first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t max_tokens,
                                                           size_t min_micro_batches = 1);

/// Fixed-size micro-batches of `sequences_per_batch` in the given order (each is
/// padded to its longest member when run).
std::vector<std::vector<size_t>> pack_fixed(size_t count, size_t sequences_per_batch);

}  // namespace areal::kernels
