// The controller's side of agent runs (task.kind = "agent"): episodes opened
// by endpoints under the same staleness gate as built-in samples, grouped by
// the agent's task key into groups of group_size, accounted for in the same
// ledger. The endpoint holds the episode's tokens; when it ends they go to the
// sample store and the controller receives the summary, as for any sample.
#include "areal/runtime/log.hpp"
#include "controller_state.hpp"

namespace areal {

const char* to_string(episode_errc x) {
  switch (x) {
    case episode_errc::gate_closed:
      return "gate_closed";
    case episode_errc::not_agent_run:
      return "not_agent_run";
    case episode_errc::run_ended:
      return "run_ended";
  }
  return "?";
}

namespace controller_detail {

caf::result<uint64_t, uint32_t, int64_t> open_episode(controller_pointer self, const std::string& task,
                                                      const std::string& holder) {
  auto& st = self->state;
  if (!st.setup.agent_episodes)
    return caf::make_error(episode_errc::not_agent_run,
                           "this run trains on its own prompts; episodes are trained in runs with task.kind = "
                           "\"agent\" (plain chat completions are served either way)");
  if (st.phase != run_phase::admitting)
    return caf::make_error(
        episode_errc::run_ended,
        "the run admits no more episodes (" + (st.end_why.empty() ? std::string{"it is ending"} : st.end_why) + ")");
  if (st.gate->capacity() <= 0 && st.gate->at_total_limit())
    return caf::make_error(episode_errc::gate_closed,
                           "the run has every episode its remaining steps train (" +
                               std::to_string(st.gate->running()) +
                               " still open); one opens again only if an episode is dropped");
  if (st.gate->capacity() <= 0)
    return caf::make_error(episode_errc::gate_closed,
                           "the staleness gate is closed (eta = " + std::to_string(st.setup.eta) + ", version " +
                               std::to_string(st.gate->version()) + ", " + std::to_string(st.gate->running()) +
                               " episodes open): the trainer catches up first; try again shortly");
  auto it = st.open_groups.find(task);
  if (it == st.open_groups.end()) {
    it = st.open_groups.emplace(task, controller_state::agent_group{st.next_group++, 0}).first;
    self->delayed_send(self, st.setup.episode_timeout, episode_atom::value, it->second.id);
  }
  auto group = it->second.id;
  auto index = it->second.opened++;
  if (static_cast<int64_t>(it->second.opened) >= st.setup.group_size)
    st.open_groups.erase(it);  // full: the task's next episode starts a new group
  sample_id id{group, index};
  st.gate->admit();
  st.ledger.admit(id, group, st.gate->version());
  st.ledger.dispatched(id, holder);
  st.episodes_running.insert(id);
  return {group, index, st.gate->version()};
}

namespace {

// The endpoint is done with this episode; false when it was not running (a
// duplicate report). An episode the ledger dropped meanwhile (its group's
// deadline, the run's end) still counted as running at the gate: released.
bool settle_episode(controller_state& st, sample_id id, bool* dropped_meanwhile) {
  if (st.episodes_running.erase(id) == 0)
    return false;
  auto entry = st.ledger.where(id);
  *dropped_meanwhile = !entry || entry->stage != sample_stage::generating;
  return true;
}

}  // namespace

void episode_ended(controller_pointer self, sample_summary& summary) {
  auto& st = self->state;
  sample_id id{summary.group_id, summary.sample_index};
  bool dropped_meanwhile = false;
  if (!settle_episode(st, id, &dropped_meanwhile) || st.phase == run_phase::finished) {
    forget(self, summary);
    return;
  }
  if (dropped_meanwhile) {
    st.gate->finish(false);
    forget(self, summary);
    return;
  }
  on_summary(self, id, "agent", summary);
}

void episode_dropped(controller_pointer self, sample_id id, const std::string& reason) {
  auto& st = self->state;
  bool dropped_meanwhile = false;
  if (!settle_episode(st, id, &dropped_meanwhile) || st.phase == run_phase::finished)
    return;
  if (dropped_meanwhile) {
    st.gate->finish(false);
    return;
  }
  spdlog::info("controller: episode {} dropped: {}", to_string(id), reason);
  drop(self, id, reason);
}

void group_deadline(controller_pointer self, uint64_t group) {
  auto& st = self->state;
  for (auto it = st.open_groups.begin(); it != st.open_groups.end(); ++it) {
    if (it->second.id != group)
      continue;
    auto reason = "task \"" + it->first + "\" opened " + std::to_string(it->second.opened) + " of its " +
                  std::to_string(st.setup.group_size) + " episodes within " +
                  std::to_string(st.setup.episode_timeout.count() / 1000) + " s";
    for (auto missing = it->second.opened; static_cast<int64_t>(missing) < st.setup.group_size; ++missing)
      st.buffer->drop_sample(group, reason);
    st.open_groups.erase(it);
    settle_drops(self);
    try_train(self);
    return;
  }
}

}  // namespace controller_detail

}  // namespace areal
