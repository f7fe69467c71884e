// The controller's behaviour. Event driven: every reply (a trajectory, a
// verdict, a training report) may free capacity, complete a group or a batch,
// and each handler ends by trying to train and to admit more work.
#include "areal/actors/controller.hpp"

#include <chrono>
#include <deque>
#include <map>

#include <caf/all.hpp>

#include "areal/actors/admission.hpp"
#include "areal/runtime/log.hpp"

namespace areal {

namespace {

struct queued_sample {
  generation_request request;
  std::shared_ptr<const reward_task> task;
};

struct controller_state {
  static inline const char* name = "areal.controller";
  controller_setup setup;
  std::unique_ptr<staleness_gate> gate;
  std::unique_ptr<group_buffer> buffer;
  std::deque<queued_sample> pending;  // samples of started groups, not yet admitted
  std::vector<int64_t> rollout_load;  // requests in flight per rollout worker
  controller_stats stats;
  bool training = false;
  bool stopping = false;
  bool finished = false;
  uint64_t next_group = 0;
  std::map<std::string, int64_t> drop_reasons;
};

using controller_pointer = controller_actor::stateful_pointer<controller_state>;

void fill(controller_pointer self);
void try_train(controller_pointer self);

void finish(controller_pointer self, int code, const std::string& why) {
  auto& st = self->state;
  if (st.finished)
    return;
  st.finished = true;
  // Whatever was admitted and will not be trained is dropped, with this reason.
  auto unfinished = st.stats.admitted - st.stats.trained - st.stats.dropped;
  if (unfinished > 0) {
    st.stats.dropped += unfinished;
    st.drop_reasons["run ended before it was trained"] += unfinished;
  }
  st.stats.running = 0;
  st.stats.buffered = 0;
  spdlog::info("controller: {} ({} steps, {} samples trained, {} dropped)", why, st.stats.steps, st.stats.trained,
               st.stats.dropped);
  if (st.setup.listener)
    caf::anon_send(st.setup.listener, done_atom::value, static_cast<int32_t>(code), why);
}

void drop(controller_pointer self, uint64_t group, const std::string& reason) {
  auto& st = self->state;
  st.gate->finish(false);
  st.buffer->drop_sample(group, reason);
  st.drop_reasons[reason]++;
}

// Moves dropped groups' counts from the buffer into the stats.
void sync_drops(controller_pointer self) {
  auto& st = self->state;
  int64_t total = 0;
  for (auto& [reason, n] : st.buffer->dropped())
    total += n;
  st.stats.dropped = total;
}

size_t least_loaded_rollout(controller_pointer self) {
  auto& load = self->state.rollout_load;
  return static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
}

void dispatch(controller_pointer self, queued_sample sample) {
  auto& state = self->state;
  auto index = least_loaded_rollout(self);
  state.rollout_load[index]++;
  state.gate->admit();
  state.stats.admitted++;
  sample.request.admitted_version = state.gate->version();
  auto group = sample.request.group_id;
  auto task = sample.task;
  self->request(state.setup.rollouts[index], caf::infinite, *pack(sample.request))
      .then(
          [self, index, task, group](packed<trajectory>& t, std::string& text) {
            auto& st = self->state;
            st.rollout_load[index]--;
            if (st.finished)
              return;
            self->request(st.setup.reward, caf::infinite, std::move(t), std::move(text), *pack(*task))
                .then(
                    [self](packed<trajectory>& scored) {
                      auto& cs = self->state;
                      if (cs.finished)
                        return;
                      auto decoded = unpack(scored);
                      if (!decoded) {
                        spdlog::warn("controller: unreadable scored trajectory: {}", describe(decoded.error()));
                        return;
                      }
                      cs.gate->finish(true);
                      cs.buffer->add(std::move(*decoded));
                      try_train(self);
                      fill(self);
                    },
                    [self, group](caf::error& err) {
                      if (self->state.finished)
                        return;
                      drop(self, group, "reward service: " + describe(err));
                      sync_drops(self);
                      fill(self);
                    });
          },
          [self, index, group](caf::error& err) {
            auto& st = self->state;
            st.rollout_load[index]--;
            if (st.finished)
              return;
            drop(self, group, "rollout worker: " + describe(err));
            sync_drops(self);
            fill(self);
          });
}

// Starts new groups and admits samples while the staleness gate allows.
void fill(controller_pointer self) {
  auto& st = self->state;
  while (!st.stopping && !st.finished) {
    bool rollouts_full = true;
    for (auto load : st.rollout_load)
      rollouts_full = rollouts_full && load >= st.setup.rollout_slots;
    if (rollouts_full || st.gate->capacity() <= 0)
      return;
    if (st.pending.empty()) {
      auto item = st.setup.source->next();
      if (!item) {
        st.stopping = true;  // data exhausted: train what remains
        return;
      }
      auto task = std::make_shared<const reward_task>(item->task);
      auto ids = st.setup.tokenizer->encode(item->prompt);
      auto group = st.next_group++;
      for (int64_t k = 0; k < st.setup.group_size; ++k) {
        queued_sample s;
        s.request.prompt_id = item->id;
        s.request.group_id = group;
        s.request.sample_index = static_cast<uint32_t>(k);
        s.request.prompt_tokens = ids;
        s.request.sampling = st.setup.sampling;
        s.request.seed = st.setup.seed * 1000003 + group * 131 + static_cast<uint64_t>(k);
        st.pending.push_back({std::move(s.request), task});
      }
    }
    auto sample = std::move(st.pending.front());
    st.pending.pop_front();
    dispatch(self, std::move(sample));
  }
}

void try_train(controller_pointer self) {
  auto& state = self->state;
  if (state.training || state.finished)
    return;
  // Trained now, the batch produces version v + 1 from version v: tokens older
  // than v - eta would exceed the bound.
  int64_t stale = 0;
  auto batch = state.buffer->take_batch(state.setup.batch_size, state.gate->version() - state.setup.eta, &stale);
  state.gate->discard(stale);
  sync_drops(self);
  if (!batch)
    return;
  std::vector<packed<trajectory>> packed_batch;
  for (auto& t : *batch)
    packed_batch.push_back(*pack(t));
  auto count = static_cast<int64_t>(batch->size());
  state.training = true;
  self->request(state.setup.trainer, caf::infinite, train_atom::value, std::move(packed_batch))
      .then(
          [self, count](train_report& report, local_weights& weights) {
            auto& st = self->state;
            st.training = false;
            st.stats.steps++;
            st.stats.trained += count;
            st.stats.version = report.version;
            st.stats.max_staleness = std::max(st.stats.max_staleness, report.max_staleness);
            if (st.stats.steps == 1)
              st.stats.reward_mean_first = report.reward_mean;
            st.stats.reward_mean_last = report.reward_mean;
            st.gate->set_version(report.version);
            for (auto& r : st.setup.rollouts)
              self->send(r, weights);
            spdlog::info("step {}/{}: version {}, reward {:.3f}, loss {:.4f}, staleness <= {}", st.stats.steps,
                         st.setup.total_steps, report.version, report.reward_mean, report.loss, report.max_staleness);
            if (st.stats.steps >= st.setup.total_steps) {
              finish(self, 0, "run complete");
              return;
            }
            try_train(self);
            fill(self);
          },
          [self](caf::error& err) {
            self->state.training = false;
            finish(self, 1, "the trainer failed: " + describe(err));
          });
}

}  // namespace

controller_actor spawn_controller(caf::actor_system& sys, controller_setup setup) {
  return sys.spawn([setup = std::move(setup)](controller_pointer self) mutable -> controller_actor::behavior_type {
    auto& state = self->state;
    state.setup = std::move(setup);
    state.gate = std::make_unique<staleness_gate>(state.setup.batch_size, state.setup.eta, state.setup.max_concurrent);
    state.buffer = std::make_unique<group_buffer>(state.setup.group_size);
    state.rollout_load.assign(state.setup.rollouts.size(), 0);
    fill(self);
    return {
        [self](stats_atom) {
          auto& st = self->state;
          if (!st.finished) {
            st.stats.running = st.gate->running();
            st.stats.buffered = st.buffer->ready_trajectories();
          }
          return st.stats;
        },
        [self](shutdown_atom, std::string& why) {
          self->state.stopping = true;
          finish(self, 0, why);
        },
    };
  });
}

}  // namespace areal
