// The run checkpoint's controller record (messages/run_state.capnp) <-> run_state:
// counters, the prompt stream's position, and the work in flight it saved.
#include <cmath>
#include <set>

#include "areal/messages/codec.hpp"
#include "codec_detail.hpp"
#include "run_state.capnp.h"

namespace areal {

using namespace codec_detail;

// -- run_state ----------------------------------------------------------------

caf::expected<std::vector<char>> encode(const run_state& x) {
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<wire::RunState>();
  root.setSchemaVersion(schema_version);
  root.setVersion(x.version);
  root.setSteps(x.steps);
  root.setAdmitted(x.admitted);
  root.setTrained(x.trained);
  root.setDropped(x.dropped);
  auto drops = root.initDropReasons(static_cast<unsigned>(x.drop_reasons.size()));
  unsigned i = 0;
  for (auto& [reason, count] : x.drop_reasons) {
    drops[i].setReason(text(reason));
    drops[i].setCount(count);
    ++i;
  }
  root.setMaxStaleness(x.max_staleness);
  root.setRewardMeanFirst(x.reward_mean_first);
  root.setRewardMeanLast(x.reward_mean_last);
  root.setSourcePosition(x.source_position);
  auto requeue = root.initRequeue(static_cast<unsigned>(x.requeue.size()));
  for (unsigned k = 0; k < x.requeue.size(); ++k)
    requeue.set(k, x.requeue[k]);
  auto dropped = root.initDroppedPositions(static_cast<unsigned>(x.dropped_positions.size()));
  for (unsigned k = 0; k < x.dropped_positions.size(); ++k)
    dropped.set(k, x.dropped_positions[k]);
  root.setNextGroup(x.next_group);
  root.setGeneratedTokens(x.generated_tokens);
  root.setTrainedTokens(x.trained_tokens);
  root.setElapsedS(x.elapsed_s);
  root.setMetricsBytes(x.metrics_bytes);
  if (!x.requeue_groups.empty() && x.requeue_groups.size() != x.requeue.size())
    return invalid("run_state: " + std::to_string(x.requeue_groups.size()) + " group ids for " +
                   std::to_string(x.requeue.size()) + " re-queued groups");
  fill(root.initRequeueGroups(static_cast<unsigned>(x.requeue_groups.size())), x.requeue_groups);
  auto saved = root.initSaved(static_cast<unsigned>(x.saved.size()));
  for (unsigned k = 0; k < x.saved.size(); ++k) {
    auto& sample = x.saved[k];
    auto segments = saved[k].initSegments(static_cast<unsigned>(sample.segments.size()));
    for (unsigned j = 0; j < sample.segments.size(); ++j) {
      if (auto err = check_lengths(sample.segments[j]))
        return err;
      write_trajectory(segments[j], sample.segments[j]);
    }
    saved[k].setScored(sample.scored);
  }
  return finish(builder);
}

template <>
caf::expected<run_state> decode<run_state>(const char* data, size_t size) {
  return read_root<wire::RunState, run_state>(
      "run_state", data, size, [](wire::RunState::Reader r) -> caf::expected<run_state> {
        run_state x;
        x.version = r.getVersion();
        x.steps = r.getSteps();
        x.admitted = r.getAdmitted();
        x.trained = r.getTrained();
        x.dropped = r.getDropped();
        for (auto d : r.getDropReasons())
          if (!x.drop_reasons.emplace(to_std(d.getReason()), d.getCount()).second)
            return invalid("run_state: drop reason \"" + to_std(d.getReason()) + "\" is listed twice");
        x.max_staleness = r.getMaxStaleness();
        x.reward_mean_first = r.getRewardMeanFirst();
        x.reward_mean_last = r.getRewardMeanLast();
        x.source_position = r.getSourcePosition();
        for (auto p : r.getRequeue())
          x.requeue.push_back(p);
        for (auto p : r.getDroppedPositions())
          x.dropped_positions.push_back(p);
        x.next_group = r.getNextGroup();
        x.generated_tokens = r.getGeneratedTokens();
        x.trained_tokens = r.getTrainedTokens();
        x.elapsed_s = r.getElapsedS();
        x.metrics_bytes = r.getMetricsBytes();
        x.requeue_groups = to_vector<uint64_t>(r.getRequeueGroups());
        if (!x.requeue_groups.empty() && x.requeue_groups.size() != x.requeue.size())
          return invalid("run_state: " + std::to_string(x.requeue_groups.size()) + " group ids for " +
                         std::to_string(x.requeue.size()) + " re-queued groups");
        std::set<uint64_t> requeued(x.requeue_groups.begin(), x.requeue_groups.end());
        for (auto s : r.getSaved()) {
          saved_sample sample;
          sample.scored = s.getScored();
          for (auto segment : s.getSegments()) {
            auto t = read_trajectory(segment);
            if (!t)
              return std::move(t.error());
            if (!sample.segments.empty() && (t->group_id != sample.segments[0].group_id ||
                                             t->sample_index != sample.segments[0].sample_index))
              return invalid("run_state: a saved sample's trajectories name different samples");
            sample.segments.push_back(std::move(*t));
          }
          if (sample.segments.empty())
            return invalid("run_state: a saved sample with no trajectory");
          if (requeued.count(sample.segments[0].group_id) == 0)
            return invalid("run_state: saved sample " + std::to_string(sample.segments[0].group_id) + "/" +
                           std::to_string(sample.segments[0].sample_index) + " is of no re-queued group");
          if (!sample.scored && (sample.segments.size() != 1 || sample.segments[0].finish == finish_reason::aborted))
            return invalid("run_state: an unscored saved sample is one trajectory, unfinished, stop or length");
          x.saved.push_back(std::move(sample));
        }
        int64_t settled = 0;
        if (x.version < 0 || x.steps < 0 || x.trained < 0 || x.dropped < 0 ||
            __builtin_add_overflow(x.trained, x.dropped, &settled) || x.admitted != settled ||
            x.metrics_bytes < -1 || x.generated_tokens < 0 || x.trained_tokens < 0 || !(x.elapsed_s >= 0) ||
            !std::isfinite(x.elapsed_s))
          return invalid("run_state: impossible counters (version " + std::to_string(x.version) + ", steps " +
                         std::to_string(x.steps) + ", admitted " + std::to_string(x.admitted) + ", trained " +
                         std::to_string(x.trained) + ", dropped " + std::to_string(x.dropped) + ", tokens " +
                         std::to_string(x.generated_tokens) + "/" + std::to_string(x.trained_tokens) + ", elapsed " +
                         std::to_string(x.elapsed_s) + " s, metrics bytes " + std::to_string(x.metrics_bytes) + ")");
        if (!std::isfinite(x.reward_mean_first) || !std::isfinite(x.reward_mean_last))
          return invalid("run_state: the reward means (" + std::to_string(x.reward_mean_first) + ", " +
                         std::to_string(x.reward_mean_last) + ") are not numbers");
        return x;
      });
}

}  // namespace areal
