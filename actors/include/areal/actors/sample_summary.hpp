// What the controller learns of a scored sample (its ids, verdict and lengths)
// while the trajectory itself stays in the sample store. A plain record with a
// CAF inspector, so that it crosses nodes; no actor logic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

namespace areal {

/// What the controller learns of a scored sample: the ids, the verdict and the
/// lengths. The trajectory itself stays in the sample store, under `slot`.
struct sample_summary {
  uint64_t slot = 0;  // the sample store's key for the trajectory
  uint64_t group_id = 0;
  uint32_t sample_index = 0;
  float reward = 0;
  uint8_t judged = 0;  // a verdict
  uint8_t finish = 0;  // a finish_reason
  int64_t output_tokens = 0;
  /// The policy versions of the output tokens, run-length encoded: (version,
  /// count) pairs in token order (versions only grow along a sequence).
  std::vector<int64_t> version_runs;
  std::string producer;  // the rollout worker that generated it
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sample_summary& x) {
  return f(caf::meta::type_name("areal.sample_summary"), x.slot, x.group_id, x.sample_index, x.reward, x.judged,
           x.finish, x.output_tokens, x.version_runs, x.producer);
}

/// The oldest policy version of the output tokens (`fallback` when there are none).
inline int64_t oldest_version(const sample_summary& s, int64_t fallback) {
  auto oldest = fallback;
  for (size_t i = 0; i + 1 < s.version_runs.size(); i += 2)
    oldest = s.version_runs[i] < oldest ? s.version_runs[i] : oldest;
  return oldest;
}

}  // namespace areal
