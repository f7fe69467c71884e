// The sample store's behaviour (see sample_store.hpp): trajectories by slot,
// decoded once on arrival, handed to the trainer by pointer.
#include "areal/actors/sample_store.hpp"
#include "areal/actors/exception_guard.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <caf/all.hpp>

namespace areal {

sample_summary summarize(const trajectory& t, uint64_t slot) {
  sample_summary s;
  s.slot = slot;
  s.group_id = t.group_id;
  s.sample_index = t.sample_index;
  s.reward = t.reward;
  s.judged = static_cast<uint8_t>(t.judged);
  s.finish = static_cast<uint8_t>(t.finish);
  s.output_tokens = static_cast<int64_t>(t.output_tokens.size());
  for (auto v : t.token_versions) {
    if (!s.version_runs.empty() && s.version_runs[s.version_runs.size() - 2] == v) {
      s.version_runs.back()++;
    } else {
      s.version_runs.push_back(v);
      s.version_runs.push_back(1);
    }
  }
  s.producer = t.producer;
  return s;
}

namespace {

struct store_state {
  static inline const char* name = "areal.sample_store";
  trainer_actor trainer;
  std::map<uint64_t, trajectory> held;
  uint64_t next_slot = 0;
};

using store_pointer = sample_store_actor::stateful_pointer<store_state>;

}  // namespace

sample_store_actor spawn_sample_store(caf::actor_system& sys, trainer_actor trainer) {
  return sys.spawn([trainer](store_pointer self) -> sample_store_actor::behavior_type {
    guard_exceptions(self, "sample store");
    self->state.trainer = trainer;
    return {
        [self](packed<trajectory>& bytes) -> caf::result<sample_summary> {
          auto t = unpack(bytes);
          if (!t)
            return std::move(t.error());
          auto slot = self->state.next_slot++;
          auto summary = summarize(*t, slot);
          self->state.held.emplace(slot, std::move(*t));
          return summary;
        },
        [self](train_atom, std::vector<uint64_t>& slots) -> caf::result<train_report> {
          auto& st = self->state;
          if (std::set<uint64_t>(slots.begin(), slots.end()).size() != slots.size())
            return caf::make_error(caf::sec::invalid_argument, "sample store: a batch names a slot twice");
          for (auto slot : slots)
            if (st.held.count(slot) == 0)
              return caf::make_error(caf::sec::invalid_argument,
                                     "sample store: slot " + std::to_string(slot) + " is not held");
          auto batch = std::make_shared<std::vector<trajectory>>();
          for (auto slot : slots) {
            auto it = st.held.find(slot);
            batch->push_back(std::move(it->second));
            st.held.erase(it);
          }
          // In sample order, not arrival order: the micro-batches, and so the
          // step, are the same whatever order the threads delivered the samples in.
          std::sort(batch->begin(), batch->end(), [](const trajectory& x, const trajectory& y) {
            return x.group_id != y.group_id ? x.group_id < y.group_id : x.sample_index < y.sample_index;
          });
          return self->delegate(st.trainer, train_atom::value, local_batch{std::move(batch)});
        },
        [self](forget_atom, std::vector<uint64_t>& slots) {
          for (auto slot : slots)
            self->state.held.erase(slot);
        },
        [self](stats_atom) { return static_cast<uint64_t>(self->state.held.size()); },
    };
  });
}

}  // namespace areal
