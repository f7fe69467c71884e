// The sample store's behaviour (see sample_store.hpp): trajectories by slot,
// decoded once on arrival, handed to the trainer by pointer.
#include "areal/actors/sample_store.hpp"
#include "areal/actors/exception_guard.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "areal/runtime/files.hpp"
#include "areal/runtime/log.hpp"

namespace areal {

sample_summary summarize(const std::vector<trajectory>& segments, uint64_t slot) {
  sample_summary s;
  s.slot = slot;
  auto& t = segments.back();
  s.group_id = t.group_id;
  s.sample_index = t.sample_index;
  s.reward = t.reward;
  s.judged = static_cast<uint8_t>(t.judged);
  s.finish = static_cast<uint8_t>(t.finish);
  for (auto& segment : segments) {
    s.output_tokens += segment.generated_tokens();
    for (auto v : segment.token_versions) {
      if (!s.version_runs.empty() && s.version_runs[s.version_runs.size() - 2] == v) {
        s.version_runs.back()++;
      } else {
        s.version_runs.push_back(v);
        s.version_runs.push_back(1);
      }
    }
  }
  s.producer = t.producer;
  return s;
}

sample_summary summarize(const trajectory& t, uint64_t slot) {
  return summarize(std::vector<trajectory>{t}, slot);
}

namespace {

struct store_state {
  static inline const char* name = "areal.sample_store";
  trainer_actor trainer;
  std::map<uint64_t, std::vector<trajectory>> held;  // one sample's trajectories (most samples: one)
  uint64_t next_slot = 0;
  std::unique_ptr<append_only_file> record;  // rl.record_trajectories
  uint64_t batches = 0;
};

using store_pointer = sample_store_actor::stateful_pointer<store_state>;

}  // namespace

namespace {

// One trained trajectory as a JSON line (rl.record_trajectories).
std::string record_line(const trajectory& t, uint64_t batch) {
  nlohmann::json j = {{"batch", batch},
                      {"group", t.group_id},
                      {"index", t.sample_index},
                      {"reward", t.reward},
                      {"producer", t.producer},
                      {"prompt_version", t.prompt_version},
                      {"prompt_tokens", t.prompt_tokens},
                      {"output_tokens", t.output_tokens},
                      {"loss_mask", t.loss_mask},
                      {"token_versions", t.token_versions},
                      {"behaviour_logprobs", t.behaviour_logprobs}};
  return j.dump() + "\n";
}

}  // namespace

sample_store_actor spawn_sample_store(caf::actor_system& sys, trainer_actor trainer, std::string record_path) {
  return sys.spawn([trainer, record_path](store_pointer self) -> sample_store_actor::behavior_type {
    guard_exceptions(self, "sample store");
    self->state.trainer = trainer;
    if (!record_path.empty())
      self->state.record = std::make_unique<append_only_file>(record_path);
    return {
        [self](packed<trajectory>& bytes) -> caf::result<sample_summary> {
          auto t = unpack(bytes);
          if (!t)
            return std::move(t.error());
          auto slot = self->state.next_slot++;
          auto summary = summarize(*t, slot);
          self->state.held.emplace(slot, std::vector<trajectory>{std::move(*t)});
          return summary;
        },
        [self](std::vector<packed<trajectory>>& parts) -> caf::result<sample_summary> {
          std::vector<trajectory> segments;
          for (auto& bytes : parts) {
            auto t = unpack(bytes);
            if (!t)
              return std::move(t.error());
            if (!segments.empty() &&
                (t->group_id != segments[0].group_id || t->sample_index != segments[0].sample_index))
              return caf::make_error(caf::sec::invalid_argument,
                                     "sample store: the trajectories of one sample name different samples");
            segments.push_back(std::move(*t));
          }
          if (segments.empty())
            return caf::make_error(caf::sec::invalid_argument, "sample store: a sample with no trajectory");
          auto slot = self->state.next_slot++;
          auto summary = summarize(segments, slot);
          self->state.held.emplace(slot, std::move(segments));
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
            for (auto& t : it->second)
              batch->push_back(std::move(t));
            st.held.erase(it);
          }
          // In sample order, not arrival order: the micro-batches, and so the
          // step, are the same whatever order the threads delivered the samples in.
          std::sort(batch->begin(), batch->end(), [](const trajectory& x, const trajectory& y) {
            return x.group_id != y.group_id ? x.group_id < y.group_id : x.sample_index < y.sample_index;
          });
          auto number = st.batches++;
          if (st.record) {
            std::string lines;
            for (auto& t : *batch)
              lines += record_line(t, number);
            try {
              st.record->append(lines);
            } catch (const std::exception& e) {
              spdlog::warn("sample store: recording trajectories stopped: {}", e.what());
              st.record.reset();
            }
          }
          return self->delegate(st.trainer, train_atom::value, local_batch{std::move(batch)});
        },
        [self](forget_atom, std::vector<uint64_t>& slots) {
          for (auto slot : slots)
            self->state.held.erase(slot);
        },
        [self](stats_atom) { return static_cast<uint64_t>(self->state.held.size()); },
        [self](snapshot_atom) {
          std::vector<packed<trajectory>> out;
          for (auto& [slot, segments] : self->state.held)
            for (auto& t : segments)
              if (auto bytes = pack(t))
                out.push_back(std::move(*bytes));
          return out;
        },
    };
  });
}

}  // namespace areal
