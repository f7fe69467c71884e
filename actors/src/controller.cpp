// The controller's behaviour (see controller.hpp): samples from the prompt
// stream out to a rollout worker and reward pool each, their summaries into
// the group buffer, members joining and lost. Event driven: every reply may free capacity or
// complete a group, and each handler ends by trying to train and to admit
// more work. The course of the run is in controller_steps.cpp.
#include <algorithm>

#include "areal/actors/exception_guard.hpp"
#include "areal/runtime/log.hpp"
#include "controller_state.hpp"

namespace areal {

namespace controller_detail {

// Closes the groups the buffer dropped: their samples are dropped in the
// ledger, they no longer count as accepted (so admission replaces them) and a
// checkpoint will not re-queue them.
void settle_drops(controller_pointer self) {
  auto& st = self->state;
  for (auto& closed : st.buffer->take_dropped_groups()) {
    st.gate->discard(closed.delivered);
    st.stream->close_dropped(closed.group_id);
    st.ledger.drop_group(closed.group_id, closed.reason);
    if (!closed.slots.empty())
      self->send(st.setup.store, forget_atom::value, std::move(closed.slots));
  }
}

namespace {

sample_id id_of(const generation_request& r) {
  return {r.group_id, r.sample_index};
}

}  // namespace

void drop(controller_pointer self, sample_id id, const std::string& reason) {
  auto& st = self->state;
  st.gate->finish(false);
  st.ledger.dropped(id, reason);
  st.buffer->drop_sample(id.group, reason);
  settle_drops(self);
  // A run whose every sample fails (a request no engine can take, a broken
  // verifier) would admit and drop forever: it stops and says why.
  if (++st.failures_in_row >= std::max<int64_t>(64, 4 * st.setup.batch_size)) {
    finish(self, 1,
           "the last " + std::to_string(st.failures_in_row) + " samples all failed; the last one: " + reason +
               ". Fix the configuration (e.g. rl.max_new_tokens against the model's context) and start again");
  }
}

namespace {

// A sample whose generation failed (a lost node, a deadline, an aborted
// sequence) is generated again, first in line; after 3 failures of its own it
// is dropped with the reason. A lost node is not the sample's fault.
void generate_again(controller_pointer self, stream_sample sample, const std::string& why, bool its_fault) {
  auto& st = self->state;
  auto id = id_of(sample.request);
  if (its_fault && ++sample.failures >= 3) {
    drop(self, id, "rollout worker: " + why + " (3 attempts)");
    return;
  }
  st.ledger.retry(id, why);
  st.stream->generate_again(std::move(sample));
}

// The request of a sample is over (answered, failed, or its member lost): its
// work at both tables is taken back. Nothing when it was taken back before.
std::optional<stream_sample> settle_request(controller_state& st, uint64_t rid) {
  auto done = st.rollouts.take(rid);
  if (!done)
    return std::nullopt;
  st.rewards.take(done->pool_request);
  return std::move(done->sample);
}

}  // namespace

void request_deadlines(controller_pointer self) {
  auto& st = self->state;
  auto now = self->clock().now();
  // Entries leave from the front: past their deadline, or answered already
  // (so the queue holds no more than the requests since the oldest in flight).
  while (!st.deadlines.empty() &&
         (st.deadlines.front().first <= now || !st.rollouts.work(st.deadlines.front().second))) {
    auto rid = st.deadlines.front().second;
    st.deadlines.pop_front();
    if (auto late = settle_request(st, rid); late && st.phase != run_phase::finished) {
      // Its reply, if it still comes, finds the request forgotten and is let go.
      generate_again(self, std::move(*late), "no reply within the request timeout", true);
      fill(self);
    }
  }
  if (st.deadlines.empty() || st.request_deadline_armed || st.phase == run_phase::finished)
    return;
  st.request_deadline_armed = true;
  self->delayed_send(self, st.deadlines.front().first - now, deadline_atom::value);
}

void on_reply(controller_pointer self, uint64_t rid, sample_summary& summary) {
  auto& st = self->state;
  auto* work = st.rollouts.work(rid);
  auto pool = work ? work->pool : std::string{};
  auto done = settle_request(st, rid);
  if (rid < st.first_rid_of_epoch)
    return;  // sent before the trainer was lost: its slot was in the lost store
  if (!done || st.phase == run_phase::finished) {
    // forgotten (past its deadline, or its member was lost, and the sample sent again), or the run is over
    forget(self, summary);
    return;
  }
  on_summary(self, id_of(done->request), pool, summary);
  fill(self);
}

void on_failure(controller_pointer self, uint64_t rid, const caf::error& err) {
  auto failed = settle_request(self->state, rid);
  if (!failed || self->state.phase == run_phase::finished)
    return;
  generate_again(self, std::move(*failed), describe(err), true);
  fill(self);
}

void forget(controller_pointer self, const sample_summary& summary) {
  self->send(self->state.setup.store, forget_atom::value, std::vector<uint64_t>{summary.slot});
}

void on_summary(controller_pointer self, sample_id id, const std::string& pool, sample_summary& summary) {
  auto& st = self->state;
  auto finished = static_cast<finish_reason>(summary.finish);
  if (summary.group_id != id.group || summary.sample_index != id.index) {
    forget(self, summary);
    drop(self, id, "the sample store answered for sample " + to_string({summary.group_id, summary.sample_index}));
  } else if (finished != finish_reason::stop && finished != finish_reason::length) {
    // Rollout workers answer an aborted sequence with an error (generated again);
    // whatever else produced an unfinished trajectory, it is not trained.
    forget(self, summary);
    drop(self, id, std::string{"a trajectory that ended "} + to_string(finished) + " reached the buffer");
  } else {
    st.gate->finish(true);
    st.ledger.generated(id, pool);
    st.ledger.scored(id);
    st.failures_in_row = 0;
    st.generated_tokens += summary.output_tokens;
    st.metrics->generated(summary.output_tokens);
    st.buffer->add(std::move(summary));
    settle_drops(self);
    try_train(self);
  }
}

namespace {

// The actor that holds one rollout worker's requests: it sends each on and
// hands the reply (or the error) back to whoever sent it the request, as
// (reply_atom, request id, reply). It holds no reference to the controller
// between requests, so that the two do not keep each other alive. Its own wait
// ends with the controller's deadline, and it ends with the controller (linked):
// a reply that never comes holds nothing, not even the actor system's shutdown.
member_link_actor spawn_link(controller_pointer self, rollout_actor worker) {
  auto timeout = self->state.setup.request_timeout;
  return self->spawn<caf::linked>([worker,
                                   timeout](member_link_actor::pointer link) -> member_link_actor::behavior_type {
    return {[link, worker, timeout](uint64_t rid, packed<generation_request>& request, packed<reward_task>& task,
                                    caf::actor& pool, caf::actor& store) {
      auto to = caf::actor_cast<controller_actor>(link->current_sender());
      link->request(worker, timeout, std::move(request), std::move(task), pool, store)
          .then(
              [link, to, rid](sample_summary& summary) { link->send(to, reply_atom::value, rid, std::move(summary)); },
              [link, to, rid](caf::error& err) { link->send(to, reply_atom::value, rid, std::move(err)); });
    }};
  });
}

// One request per sample: the worker generates it and sends it to the pool,
// the pool scores it and hands it to the store, the store's summary is the reply.
// A sample scored before a resume: its trajectories go to the store as they
// were, and its summary to the buffer (nothing generated or scored again).
void restore_scored(controller_pointer self, stream_sample sample) {
  auto& st = self->state;
  auto id = id_of(sample.request);
  std::vector<packed<trajectory>> parts;
  for (auto& t : sample.scored)
    parts.push_back(*pack(t));
  st.ledger.dispatched(id, "checkpoint");
  auto epoch = st.trainer_epoch;
  self->request(st.setup.store, st.setup.trainer_timeout, std::move(parts))
      .then(
          [self, id, epoch](sample_summary& summary) {
            if (self->state.trainer_epoch != epoch)
              return;  // its store was lost with the trainer
            if (self->state.phase == run_phase::finished) {
              forget(self, summary);
              return;
            }
            on_summary(self, id, "checkpoint", summary);
            fill(self);
          },
          [self, id, epoch](caf::error& err) {
            if (self->state.phase != run_phase::finished && self->state.trainer_epoch == epoch)
              drop(self, id, "its saved trajectories did not reach the sample store: " + describe(err));
          });
}

void dispatch(controller_pointer self, uint64_t worker, uint64_t pool, stream_sample sample) {
  auto& st = self->state;
  auto id = id_of(sample.request);
  // Saved by a checkpoint, its tokens are as old as its first admission.
  bool saved = !sample.scored.empty() || !sample.request.so_far.tokens.empty();
  if (!sample.admitted) {
    st.gate->admit(1, st.rollouts.at(worker).node);
    if (!saved)
      sample.request.admitted_version = st.gate->version();
    st.ledger.admit(id, sample.prompt_position, sample.request.admitted_version);
    sample.admitted = true;
  }
  if (!sample.scored.empty()) {
    restore_scored(self, std::move(sample));
    return;
  }
  auto& member = st.rollouts.at(worker);
  auto& link = st.links[member.handle.address()];
  if (!link)
    link = spawn_link(self, caf::actor_cast<rollout_actor>(member.handle));
  auto pool_handle = st.rewards.at(pool).handle;
  auto pool_name = st.rewards.at(pool).name;
  st.ledger.dispatched(id, member.name);
  auto request = *pack(sample.request);
  auto task = *pack(*sample.task);
  auto rid = st.rollouts.send(worker, {std::move(sample), 0, pool_name});
  st.next_rid = rid + 1;
  st.rollouts.work(rid)->pool_request = st.rewards.send(pool, rid);
  st.deadlines.emplace_back(self->clock().now() + st.setup.request_timeout, rid);
  request_deadlines(self);
  self->send(link, rid, std::move(request), std::move(task), pool_handle, caf::actor_cast<caf::actor>(st.setup.store));
}

// With no rollout worker, or no reward pool, no sample can go out (each goes
// out with both): the run waits member_timeout for the missing role, counted
// from when it went missing (a role that comes back and goes again starts anew).
void arm_member_deadline(controller_pointer self) {
  auto& st = self->state;
  if ((!st.rollouts.empty() && !st.rewards.empty()) || st.phase == run_phase::finished || st.setup.agent_episodes)
    return;
  auto now = self->clock().now();
  if (!st.members_missing_since)
    st.members_missing_since = now;
  if (st.member_deadline_armed)
    return;
  st.member_deadline_armed = true;
  self->delayed_send(self, *st.members_missing_since + st.setup.member_timeout - now, caf::tick_atom::value);
}

void on_join(controller_pointer self, const std::string& node, const std::string& role, const caf::actor& handle) {
  auto& st = self->state;
  if (!handle || st.phase == run_phase::finished)
    return;
  if (role != "rollout" && role != "reward") {
    spdlog::warn("controller: node {} offered a member of unknown role \"{}\"", node, role);
    return;
  }
  bool rollout = role == "rollout";
  auto name = (node.empty() ? std::string{"local"} : node) + "/" + role + "#" + std::to_string(handle.id());
  if (!(rollout ? st.rollouts.add(handle, node, name) : st.rewards.add(handle, node, name)))
    return;
  self->monitor(handle);
  if (!st.rollouts.empty() && !st.rewards.empty())
    st.members_missing_since.reset();
  spdlog::info("controller: a {} joined from node {} ({} rollout worker(s), {} reward pool(s))",
               role == "rollout" ? "rollout worker" : "reward pool", node, st.rollouts.size(), st.rewards.size());
  fill(self);
}

// A member is gone: its unfinished samples are generated again by the others
// (a lost reward pool: every sample routed to it); none is lost or trained
// twice, since a late reply of the lost member would find its request forgotten.
void on_member_down(controller_pointer self, const caf::down_msg& down) {
  auto& st = self->state;
  if (st.phase == run_phase::finished)
    return;  // the job stops its actors after the run
  if (st.setup.trainer_rejoin.count() > 0 &&
      (down.source == st.setup.trainer.address() || down.source == st.setup.store.address())) {
    trainer_lost(self, describe(down.reason));
    return;
  }
  auto is_it = [&](const caf::actor& h) { return h.address() == down.source; };
  std::vector<stream_sample> again;
  std::string what, node;
  if (auto link = st.links.find(down.source); link != st.links.end()) {
    self->unlink_from(link->second);  // its end is not the controller's
    caf::anon_send_exit(link->second, caf::exit_reason::kill);
    st.links.erase(link);
  }
  if (auto lost = st.rollouts.lose(is_it)) {
    what = "rollout worker";
    node = lost->first.node;
    for (auto& work : lost->second) {
      st.rewards.take(work.pool_request);
      again.push_back(std::move(work.sample));
    }
  } else if (auto lost_pool = st.rewards.lose(is_it)) {
    what = "reward pool";
    node = lost_pool->first.node;
    for (auto rid : lost_pool->second)
      if (auto work = st.rollouts.take(rid))
        again.push_back(std::move(work->sample));
  } else {
    return;
  }
  spdlog::warn("controller: lost the {} on node {} ({}); {} unfinished sample(s) queued again", what,
               node.empty() ? "(this process)" : node, describe(down.reason), again.size());
  for (auto& sample : again)
    generate_again(self, std::move(sample), "lost node " + (node.empty() ? what : node), false);
  arm_member_deadline(self);
  fill(self);
}

void start(controller_pointer self, controller_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  auto& s = st.setup;
  st.stream = std::make_unique<prompt_stream>(std::move(s.source), s.encode, s.group_size, s.sampling, s.seed);
  st.gate = std::make_unique<staleness_gate>(s.batch_size, s.eta, s.max_concurrent);
  if (s.remote_weights)  // the new weights reach other nodes a transfer later than the trainer makes them
    st.gate->follow_deliveries();
  st.buffer = std::make_unique<group_buffer>(s.group_size);
  if (s.resume) {
    go_back_to(self, *s.resume);  // the metrics and the admission limit too
  } else {
    st.metrics = std::make_unique<run_metrics>(s.metrics_path, s.trace, 0.0, s.remote_weights);
    limit_admission(st);
  }
  // The members in this process are monitored as the joined ones are: a lost one's samples go to the others.
  for (auto& r : s.rollouts) {
    st.rollouts.add(caf::actor_cast<caf::actor>(r), {}, "rollout-" + std::to_string(st.rollouts.size()));
    self->monitor(r);
  }
  if (s.reward) {
    st.rewards.add(caf::actor_cast<caf::actor>(s.reward), {}, "reward-pool");
    self->monitor(s.reward);
  }
  if (s.trainer_rejoin.count() > 0) {  // its loss pauses the run instead of ending it
    self->monitor(s.trainer);
    self->monitor(s.store);
  }
  refresh_counts(st);
}

}  // namespace

// Admits samples while a rollout worker has a free slot and the staleness gate
// allows. Samples generated again were admitted already: they go even when the
// gate is closed or admission has stopped.
void fill(controller_pointer self) {
  auto& st = self->state;
  if (st.setup.agent_episodes || !trainer_ready(st))
    return;  // the agents open episodes themselves; without a trainer nothing is admitted
  while (st.phase != run_phase::finished) {
    bool again = st.stream->next_is_retry();
    if (!again && st.phase != run_phase::admitting)
      return;
    // The least loaded worker whose node the gate lets new work go to (each
    // node counts from the version it holds: staleness_gate::delivered_to).
    auto worker = st.rollouts.least_loaded(
        st.setup.rollout_slots, [&](const auto& member) { return again || st.gate->capacity(member.node) > 0; });
    auto pool = st.rewards.least_loaded();
    if (!worker || !pool)
      return;  // a sample goes out with both; a joining member, a delivery or a finished step calls fill again
    auto sample = st.stream->next();
    if (!sample) {
      st.phase = run_phase::draining;  // data exhausted: train what remains
      spdlog::info("controller: the prompt stream is exhausted; training what remains");
      if (st.gate->running() == 0 && !st.training)
        end_run(self, 0, "the prompt stream is exhausted");
      return;
    }
    dispatch(self, *worker, *pool, std::move(*sample));
  }
}

}  // namespace controller_detail

controller_actor spawn_controller(caf::actor_system& sys, controller_setup setup) {
  using namespace controller_detail;
  return sys.spawn([setup = std::move(setup)](controller_pointer self) mutable -> controller_actor::behavior_type {
    guard_exceptions(self, "controller");
    start(self, std::move(setup));
    self->set_down_handler([self](caf::down_msg& down) { on_member_down(self, down); });
    arm_member_deadline(self);
    if (!self->state.metrics->failure().empty())
      finish(self, 1, self->state.metrics->failure() + "; nothing was trained");
    else if (self->state.stats.steps >= self->state.setup.total_steps)
      end_run(self, 0, "run complete");
    else
      fill(self);
    return {
        [self](stats_atom) {
          auto& st = self->state;
          if (st.phase != run_phase::finished) {
            st.stats.running = st.gate->running();
            st.stats.buffered = st.buffer->ready_trajectories();
          }
          refresh_counts(st);
          st.stats.generated_tokens = st.generated_tokens;
          st.stats.trained_tokens = st.trained_tokens;
          return st.stats;
        },
        [self](ledger_atom) { return ledger_json(self->state.ledger); },
        [self](shutdown_atom, std::string& why) { end_run(self, 0, why); },
        [self](shutdown_atom, int32_t code, std::string& why) { end_run(self, code, why); },
        [self](join_atom, std::string& node, std::string& role, caf::actor& handle) {
          on_join(self, node, role, handle);
        },
        [self](std::vector<weight_delivery>& reports) { weights_delivered(self, reports); },
        [self](weight_delivery& report) {
          if (!report.error.empty() || report.version == INT64_MAX)
            return;  // a failed transfer or a lost subscriber: the node holds what it held
          self->state.gate->delivered_to(report.subscriber, report.version);
          fill(self);
        },
        [self](episode_atom, std::string& task, std::string& holder) { return open_episode(self, task, holder); },
        [self](episode_atom, sample_summary& summary) { episode_ended(self, summary); },
        [self](episode_atom, uint64_t group, uint32_t index, std::string& why) {
          episode_dropped(self, {group, index}, why);
        },
        [self](episode_atom, uint64_t group) { group_deadline(self, group); },
        [self](trainer_atom) { trainer_lost(self, "its node was lost"); },
        [self](trainer_atom, caf::actor& trainer, caf::actor& store, std::string& record) {
          trainer_back(self, trainer, store, record);
        },
        [self](trainer_atom, uint64_t epoch) { poll_rollout_weights(self, epoch); },
        [self](reply_atom, uint64_t rid, sample_summary& summary) { on_reply(self, rid, summary); },
        [self](reply_atom, uint64_t rid, caf::error& err) { on_failure(self, rid, err); },
        [self](deadline_atom) {
          self->state.request_deadline_armed = false;
          request_deadlines(self);
        },
        [self](caf::tick_atom) {
          auto& st = self->state;
          st.member_deadline_armed = false;
          if (st.phase == run_phase::finished || (!st.rollouts.empty() && !st.rewards.empty()))
            return;
          if (!st.members_missing_since || self->clock().now() - *st.members_missing_since < st.setup.member_timeout) {
            arm_member_deadline(self);  // missing again since the tick was set: a deadline of its own
            return;
          }
          auto missing = st.rollouts.empty() ? std::string{"rollout"} : std::string{"reward"};
          end_run(self, 1,
                  "no " + std::string{missing == "rollout" ? "rollout worker" : "reward pool"} + " for " +
                      std::to_string(st.setup.member_timeout.count() / 1000) + " s; start a node with the " + missing +
                      " role (areal --config TOPOLOGY --node NAME)");
        },
    };
  });
}

}  // namespace areal
