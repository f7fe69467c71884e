// The controller's behaviour: a thin layer of message handling over the run's
// bookkeeping parts (see controller.hpp). Event driven: every reply (a
// trajectory, a verdict, a training report) may free capacity, complete a group
// or a batch, and each handler ends by trying to train and to admit more work.
#include "areal/actors/controller.hpp"

#include <algorithm>
#include <deque>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "areal/actors/admission.hpp"
#include "areal/actors/member_table.hpp"
#include "areal/actors/run_metrics.hpp"
#include "areal/actors/sample_ledger.hpp"
#include "areal/runtime/log.hpp"

namespace areal {

namespace {

// A generated sample on its way to a reward pool (kept while the pools' queues are full).
struct reward_job {
  packed<trajectory> t;
  std::string text;
  std::shared_ptr<const reward_task> task;
  sample_id id;
};

// The run's course: admitting work, then draining (no more admissions; what
// runs is trained), saving the final checkpoint, finished.
enum class run_phase { admitting, draining, saving, finished };

struct controller_state {
  static inline const char* name = "areal.controller";
  controller_setup setup;
  std::unique_ptr<prompt_stream> stream;
  std::unique_ptr<staleness_gate> gate;
  std::unique_ptr<group_buffer> buffer;
  std::unique_ptr<run_metrics> metrics;
  sample_ledger ledger;
  member_table<caf::actor, stream_sample> rollouts;
  member_table<caf::actor, reward_job> rewards;
  std::deque<reward_job> reward_backlog;  // waiting for a reward pool (full queues, or none joined)
  run_phase phase = run_phase::admitting;
  bool training = false, checkpointing = false, evaluating = false;
  bool member_deadline_armed = false;
  int32_t end_code = 0;
  std::string end_why;          // set when an end was asked for (a stop, no rollout worker, the last step)
  int64_t failures_in_row = 0;  // samples dropped since the last one that was scored
  controller_stats stats;
  controller_checkpoint before;  // the counters of the runs before a resume
  int64_t generated_tokens = 0, trained_tokens = 0;
  std::vector<sample_id> in_training;  // the batch of the step in flight
};

using controller_pointer = controller_actor::stateful_pointer<controller_state>;

sample_id id_of(const generation_request& r) {
  return {r.group_id, r.sample_index};
}

std::map<std::string, int64_t> all_drops(const controller_state& st) {
  auto out = st.before.drop_reasons;
  for (auto& [reason, n] : st.ledger.drop_reasons())
    out[reason] += n;
  return out;
}

void refresh_counts(controller_state& st) {
  st.stats.admitted = st.before.admitted + st.ledger.admitted();
  st.stats.trained = st.before.trained + st.ledger.trained_count();
  st.stats.dropped = st.before.dropped + st.ledger.dropped_count();
}

step_counters counters(controller_state& st) {
  refresh_counts(st);
  return {st.stats.steps,     st.stats.admitted,  st.stats.trained,
          st.stats.dropped,   st.gate->running(), st.buffer->ready_trajectories(),
          st.rollouts.size(), st.rewards.size()};
}

void fill(controller_pointer self);
void try_train(controller_pointer self);

// Closes the groups the buffer dropped: their samples are dropped in the
// ledger, they no longer count as accepted (so admission replaces them) and a
// checkpoint will not re-queue them.
void settle_drops(controller_state& st) {
  for (auto& closed : st.buffer->take_dropped_groups()) {
    st.gate->discard(closed.delivered);
    st.stream->close_dropped(closed.group_id);
    st.ledger.drop_group(closed.group_id, closed.reason);
  }
}

controller_checkpoint checkpoint_record(controller_state& st) {
  refresh_counts(st);
  controller_checkpoint c;
  c.version = st.gate->version();
  c.steps = st.stats.steps;
  c.trained = st.stats.trained;
  c.drop_reasons = all_drops(st);
  c.dropped = st.stats.dropped;
  c.admitted = c.trained + c.dropped;
  c.max_staleness = st.stats.max_staleness;
  c.reward_mean_first = st.stats.reward_mean_first;
  c.reward_mean_last = st.stats.reward_mean_last;
  c.set_stream(st.stream->position());
  c.generated_tokens = st.generated_tokens;
  c.trained_tokens = st.trained_tokens;
  c.elapsed_s = st.metrics->run_seconds();
  return c;
}

void finish(controller_pointer self, int32_t code, const std::string& why) {
  auto& st = self->state;
  if (st.phase == run_phase::finished)
    return;
  st.phase = run_phase::finished;
  // Whatever was admitted and will not be trained is dropped with this reason;
  // the end line says where each one was.
  auto reason = st.setup.checkpoint_dir.empty() ? "run ended before it was trained"
                                                : "run ended before it was trained (re-queued in the checkpoint)";
  std::vector<std::string> unfinished;
  for (auto& e : st.ledger.unaccounted()) {
    if (unfinished.size() < 1000)
      unfinished.push_back(to_string(e.id) + ": " + to_string(e.stage) + (e.holder.empty() ? "" : " at " + e.holder) +
                           " (" + std::to_string(e.attempts) + " attempt(s))");
    st.ledger.dropped(e.id, reason);
  }
  auto c = counters(st);
  st.stats.running = 0;
  st.stats.buffered = 0;
  st.metrics->end(why, c, all_drops(st), unfinished);
  spdlog::info("controller: {} ({} steps, {} samples trained, {} dropped)", why, st.stats.steps, st.stats.trained,
               st.stats.dropped);
  if (st.setup.listener)
    caf::anon_send(st.setup.listener, done_atom::value, code, why);
}

// Saves the run (trainer state + this controller's record) at the current version.
// `then` runs once the checkpoint is on disk (true) or failed (false).
template <class F>
void save_checkpoint(controller_pointer self, F then) {
  auto& st = self->state;
  if (st.setup.checkpoint_dir.empty()) {
    then(true);
    return;
  }
  st.checkpointing = true;
  self->request(st.setup.trainer, caf::infinite, checkpoint_atom::value, st.setup.checkpoint_dir,
                checkpoint_record(st).to_json())
      .then(
          [self, then](int64_t version) mutable {
            self->state.checkpointing = false;
            spdlog::info("checkpoint of version {} written to {}", version, self->state.setup.checkpoint_dir);
            then(true);
          },
          [self, then](caf::error& err) mutable {
            self->state.checkpointing = false;
            spdlog::error("checkpoint failed: {}", describe(err));
            then(false);
          });
}

// Ends the run once no training step or checkpoint is in flight: final checkpoint, then done.
void end_run(controller_pointer self, int32_t code, const std::string& why) {
  auto& st = self->state;
  if (st.phase == run_phase::finished || st.phase == run_phase::saving)
    return;
  st.phase = run_phase::draining;
  st.end_code = code;
  st.end_why = why;
  if (st.training || st.checkpointing)
    return;  // the step's reply (or the checkpoint's) ends the run
  st.phase = run_phase::saving;
  save_checkpoint(self, [self](bool ok) {
    auto& s = self->state;
    finish(self, ok ? s.end_code : 1, ok ? s.end_why : s.end_why + "; the final checkpoint failed");
  });
}

// An end was asked for while a step or a checkpoint was in flight: it happens now.
bool end_if_asked(controller_pointer self) {
  auto& st = self->state;
  if (st.phase != run_phase::draining || st.end_why.empty())
    return false;
  end_run(self, st.end_code, st.end_why);
  return true;
}

void drop(controller_pointer self, sample_id id, const std::string& reason) {
  auto& st = self->state;
  st.gate->finish(false);
  st.ledger.dropped(id, reason);
  st.buffer->drop_sample(id.group, reason);
  settle_drops(st);
  // A run whose every sample fails (a request no engine can take, a broken
  // verifier) would admit and drop forever: it stops and says why.
  if (++st.failures_in_row >= std::max<int64_t>(64, 4 * st.setup.batch_size)) {
    st.phase = run_phase::draining;
    finish(self, 1,
           "the last " + std::to_string(st.failures_in_row) + " samples all failed; the last one: " + reason +
               ". Fix the configuration (e.g. rl.max_new_tokens against the model's context) and start again");
  }
}

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

void on_scored(controller_pointer self, packed<trajectory>& scored, sample_id id);

void send_to_reward(controller_pointer self, reward_job job);

// Sends waiting samples to the reward pools while some have room.
void drain_reward_backlog(controller_pointer self) {
  auto& st = self->state;
  while (!st.reward_backlog.empty() && !st.rewards.empty() && st.phase != run_phase::finished) {
    auto next = std::move(st.reward_backlog.front());
    st.reward_backlog.pop_front();
    send_to_reward(self, std::move(next));
    if (!st.reward_backlog.empty() && st.rewards.requests() >= st.rewards.size() * 256)
      return;  // plenty in flight; replies drain the rest
  }
}

// Sends a generated sample to the least loaded reward pool. A full pool queue
// is back-pressure, not a failure: the sample waits and goes again when a
// reply frees a place. With no reward pool it waits for one to join.
void send_to_reward(controller_pointer self, reward_job job) {
  auto& st = self->state;
  auto pool = st.rewards.least_loaded();
  if (!pool) {
    st.ledger.scoring_at(job.id, {});
    st.reward_backlog.push_back(std::move(job));
    return;
  }
  auto handle = caf::actor_cast<reward_pool_actor>(st.rewards.at(*pool).handle);
  st.ledger.scoring_at(job.id, st.rewards.at(*pool).name);
  auto packed_task = *pack(*job.task);
  auto t = job.t;
  auto text = job.text;
  auto request = st.rewards.send(*pool, std::move(job));
  self->request(handle, st.setup.request_timeout, std::move(t), std::move(text), std::move(packed_task))
      .then(
          [self, request](packed<trajectory>& scored) {
            auto& cs = self->state;
            auto done = cs.rewards.take(request);
            if (!done || cs.phase == run_phase::finished)
              return;  // forgotten: its pool was lost and the sample sent elsewhere
            drain_reward_backlog(self);
            on_scored(self, scored, done->id);
          },
          [self, request](caf::error& err) {
            auto& cs = self->state;
            auto refused = cs.rewards.take(request);
            if (!refused || cs.phase == run_phase::finished)
              return;
            bool queue_full =
                err.category() == caf::atom("reward") && err.code() == static_cast<uint8_t>(reward_errc::queue_full);
            if (queue_full && cs.rewards.requests() > 0) {
              cs.ledger.scoring_at(refused->id, {});
              cs.reward_backlog.push_back(std::move(*refused));
              return;
            }
            drop(self, refused->id, "reward service: " + describe(err));
            fill(self);
          });
}

void on_scored(controller_pointer self, packed<trajectory>& scored, sample_id id) {
  auto& st = self->state;
  auto decoded = unpack(scored);
  if (!decoded) {
    drop(self, id, "unreadable scored trajectory: " + describe(decoded.error()));
  } else if (decoded->finish != finish_reason::stop && decoded->finish != finish_reason::length) {
    // Rollout workers answer an aborted sequence with an error (generated again);
    // whatever else produced an unfinished trajectory, it is not trained.
    drop(self, id, std::string{"a trajectory that ended "} + to_string(decoded->finish) + " reached the buffer");
  } else {
    st.gate->finish(true);
    st.ledger.scored(id);
    st.failures_in_row = 0;
    auto tokens = static_cast<int64_t>(decoded->output_tokens.size());
    st.generated_tokens += tokens;
    st.metrics->generated(tokens);
    st.buffer->add(std::move(*decoded));
    settle_drops(st);
    try_train(self);
  }
  fill(self);
}

void dispatch(controller_pointer self, uint64_t worker, stream_sample sample) {
  auto& st = self->state;
  auto id = id_of(sample.request);
  if (!sample.admitted) {
    st.gate->admit();
    st.ledger.admit(id, sample.prompt_position, st.gate->version());
    sample.request.admitted_version = st.gate->version();
    sample.admitted = true;
  }
  auto& member = st.rollouts.at(worker);
  auto handle = caf::actor_cast<rollout_actor>(member.handle);
  st.ledger.dispatched(id, member.name);
  auto request = *pack(sample.request);
  auto rid = st.rollouts.send(worker, std::move(sample));
  self->request(handle, st.setup.request_timeout, std::move(request))
      .then(
          [self, rid](packed<trajectory>& t, std::string& text) {
            auto& s = self->state;
            auto done = s.rollouts.take(rid);
            if (!done || s.phase == run_phase::finished)
              return;  // forgotten: its worker was lost and the sample queued again
            auto sid = id_of(done->request);
            s.ledger.generated(sid);
            send_to_reward(self, {std::move(t), std::move(text), done->task, sid});
            fill(self);
          },
          [self, rid](caf::error& err) {
            auto& s = self->state;
            auto failed = s.rollouts.take(rid);
            if (!failed || s.phase == run_phase::finished)
              return;
            generate_again(self, std::move(*failed), describe(err), true);
            fill(self);
          });
}

// Admits samples while a rollout worker has a free slot and the staleness gate
// allows. Samples generated again were admitted already: they go even when the
// gate is closed or admission has stopped.
void fill(controller_pointer self) {
  auto& st = self->state;
  while (st.phase != run_phase::finished) {
    auto worker = st.rollouts.least_loaded(st.setup.rollout_slots);
    if (!worker)
      return;
    bool again = st.stream->next_is_retry();
    if (!again && (st.phase != run_phase::admitting || st.gate->capacity() <= 0))
      return;
    auto sample = st.stream->next();
    if (!sample) {
      st.phase = run_phase::draining;  // data exhausted: train what remains
      spdlog::info("controller: the prompt stream is exhausted; training what remains");
      if (st.gate->running() == 0 && !st.training)
        end_run(self, 0, "the prompt stream is exhausted");
      return;
    }
    dispatch(self, *worker, std::move(*sample));
  }
}

void request_evaluation(controller_pointer self, const local_weights& weights) {
  auto& st = self->state;
  if (!st.setup.evaluator || st.evaluating)
    return;  // one at a time; a busy evaluator skips this version
  st.evaluating = true;
  self->request(st.setup.evaluator, caf::infinite, eval_atom::value, weights)
      .then(
          [self](int64_t version, double accuracy, double mean_tokens) {
            self->state.evaluating = false;
            self->state.metrics->eval(version, accuracy, mean_tokens);
            spdlog::info("held-out accuracy of version {}: {:.1f}%", version, 100 * accuracy);
          },
          [self](caf::error& err) {
            self->state.evaluating = false;
            spdlog::warn("evaluation failed: {}", describe(err));
          });
}

// New weights to every rollout worker: through the publisher when there is
// one (local workers by pointer, remote nodes in bulk), else directly.
void publish_weights(controller_pointer self, local_weights& weights) {
  auto& st = self->state;
  if (!st.setup.publisher) {
    for (auto& r : st.rollouts.handles())
      self->send(caf::actor_cast<rollout_actor>(r), weights);
    return;
  }
  self->request(st.setup.publisher, st.setup.request_timeout, publish_atom::value, weights)
      .then(
          [self](std::vector<weight_delivery>& reports) {
            for (auto& r : reports) {
              if (!r.error.empty()) {
                self->state.metrics->transfer_failed();
                spdlog::warn("weights of version {} did not reach {}: {}", r.version, r.subscriber, r.error);
              } else if (r.backend != "in-process") {
                self->state.metrics->transferred(r.seconds);
              }
            }
          },
          [self](caf::error& err) {
            self->state.metrics->transfer_failed();
            spdlog::warn("publishing weights failed: {}", describe(err));
          });
}

void on_trained(controller_pointer self, const train_report& report, local_weights& weights, const batch_facts& facts) {
  auto& st = self->state;
  st.training = false;
  for (auto& id : st.in_training)
    st.ledger.trained(id);
  st.in_training.clear();
  st.stats.steps++;
  st.stats.version = report.version;
  st.stats.max_staleness = std::max(st.stats.max_staleness, report.max_staleness);
  if (st.stats.steps == 1)
    st.stats.reward_mean_first = report.reward_mean;
  st.stats.reward_mean_last = report.reward_mean;
  st.trained_tokens += report.tokens;
  st.gate->set_version(report.version);
  publish_weights(self, weights);
  st.metrics->step(facts, report, counters(st));
  spdlog::debug("step {}/{}: version {}, reward {:.3f}, loss {:.4f}, staleness <= {}", st.stats.steps,
                st.setup.total_steps, report.version, report.reward_mean, report.loss, report.max_staleness);

  bool last = st.stats.steps >= st.setup.total_steps;
  if (st.setup.eval_every > 0 && st.stats.steps % st.setup.eval_every == 0 && !last)
    request_evaluation(self, weights);
  if (last) {
    end_run(self, 0, "run complete");
    return;
  }
  if (end_if_asked(self))  // a stop arrived during the step
    return;
  if (st.setup.checkpoint_every > 0 && st.stats.steps % st.setup.checkpoint_every == 0)
    save_checkpoint(self, [self](bool) {
      if (!end_if_asked(self))
        try_train(self);
    });
  else
    try_train(self);
  fill(self);
}

void try_train(controller_pointer self) {
  auto& st = self->state;
  if (st.training || st.checkpointing || st.phase == run_phase::saving || st.phase == run_phase::finished)
    return;
  // Trained now, the batch produces version v + 1 from version v: tokens older
  // than v - eta would exceed the bound.
  auto batch = st.buffer->take_batch(st.setup.batch_size, st.gate->version() - st.setup.eta);
  settle_drops(st);
  if (!batch) {
    if (st.phase == run_phase::draining && st.gate->running() == 0 && !end_if_asked(self) && st.stream->waiting() == 0)
      end_run(self, 0, "the prompt stream is exhausted");
    return;
  }
  auto facts = describe_batch(*batch, st.gate->version());
  std::vector<packed<trajectory>> packed_batch;
  for (auto& t : *batch) {
    sample_id id{t.group_id, t.sample_index};
    st.ledger.batched(id, st.stats.steps + 1);
    st.in_training.push_back(id);
    if (auto position = st.stream->close_trained(t.group_id))
      facts.prompt_positions.push_back(*position);
    packed_batch.push_back(*pack(t));
  }
  st.training = true;
  self->request(st.setup.trainer, caf::infinite, train_atom::value, std::move(packed_batch))
      .then([self, facts](train_report& report, local_weights& weights) { on_trained(self, report, weights, facts); },
            [self](caf::error& err) {
              self->state.training = false;
              finish(self, 1, "the trainer failed: " + describe(err));
            });
}

// With no rollout worker the run cannot progress: it waits member_timeout for one.
void arm_member_deadline(controller_pointer self) {
  auto& st = self->state;
  if (!st.rollouts.empty() || st.member_deadline_armed || st.phase == run_phase::finished)
    return;
  st.member_deadline_armed = true;
  self->delayed_send(self, st.setup.member_timeout, caf::tick_atom::value);
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
  auto name = (node.empty() ? std::string{"local"} : node) + "/" + role + "#" +
              std::to_string(rollout ? st.rollouts.size() : st.rewards.size());
  if (!(rollout ? st.rollouts.add(handle, node, name) : st.rewards.add(handle, node, name)))
    return;
  self->monitor(handle);
  spdlog::info("controller: a {} joined from node {} ({} rollout worker(s), {} reward pool(s))",
               role == "rollout" ? "rollout worker" : "reward pool", node, st.rollouts.size(), st.rewards.size());
  drain_reward_backlog(self);
  fill(self);
}

// A member is gone: its unfinished samples are generated (or scored) again by
// the others; none is lost or trained twice, since a late reply of the lost
// member would find its request forgotten.
void on_member_down(controller_pointer self, const caf::down_msg& down) {
  auto& st = self->state;
  auto is_it = [&](const caf::actor& h) { return h.address() == down.source; };
  size_t requeued = 0;
  std::string what, node;
  if (auto lost = st.rollouts.lose(is_it)) {
    what = "rollout worker";
    node = lost->first.node;
    for (auto& sample : lost->second)
      generate_again(self, std::move(sample), "lost node " + node, false);
    requeued = lost->second.size();
  } else if (auto lost_pool = st.rewards.lose(is_it)) {
    what = "reward pool";
    node = lost_pool->first.node;
    for (auto& job : lost_pool->second) {
      st.ledger.scoring_at(job.id, {});
      st.reward_backlog.push_front(std::move(job));
    }
    requeued = lost_pool->second.size();
  } else {
    return;
  }
  spdlog::warn("controller: lost the {} on node {} ({}); {} unfinished sample(s) queued again", what,
               node.empty() ? "(this process)" : node, describe(down.reason), requeued);
  if (st.phase == run_phase::finished)
    return;
  arm_member_deadline(self);
  drain_reward_backlog(self);
  fill(self);
}

std::string ledger_json(const sample_ledger& ledger) {
  auto out = nlohmann::json::array();
  for (auto& e : ledger.entries())
    out.push_back({e.id.group, e.id.index, to_string(e.stage), e.holder, e.attempts, e.step, e.reason});
  return out.dump();
}

void start(controller_pointer self, controller_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  auto& s = st.setup;
  st.stream = std::make_unique<prompt_stream>(std::move(s.source), s.encode, s.group_size, s.sampling, s.seed);
  st.gate = std::make_unique<staleness_gate>(s.batch_size, s.eta, s.max_concurrent);
  st.buffer = std::make_unique<group_buffer>(s.group_size);
  st.metrics = std::make_unique<run_metrics>(s.metrics_path, s.trace, s.resume ? s.resume->elapsed_s : 0.0,
                                             static_cast<bool>(s.publisher));
  // The members in this process are monitored as the joined ones are: a lost one's samples go to the others.
  for (auto& r : s.rollouts) {
    st.rollouts.add(caf::actor_cast<caf::actor>(r), {}, "rollout-" + std::to_string(st.rollouts.size()));
    self->monitor(r);
  }
  if (s.reward) {
    st.rewards.add(caf::actor_cast<caf::actor>(s.reward), {}, "reward-pool");
    self->monitor(s.reward);
  }
  if (auto& r = s.resume) {
    // Counters continue; the unfinished groups of the checkpoint are generated again first.
    st.before = *r;
    st.gate->restore(r->version);
    st.stats.version = r->version;
    st.stats.steps = r->steps;
    st.stats.max_staleness = r->max_staleness;
    st.stats.reward_mean_first = r->reward_mean_first;
    st.stats.reward_mean_last = r->reward_mean_last;
    st.stream->restore(r->stream());
    st.generated_tokens = r->generated_tokens;
    st.trained_tokens = r->trained_tokens;
    st.metrics->resume(r->version, r->steps, r->source_position, r->requeue.size());
  }
  refresh_counts(st);
}

}  // namespace

controller_actor spawn_controller(caf::actor_system& sys, controller_setup setup) {
  return sys.spawn([setup = std::move(setup)](controller_pointer self) mutable -> controller_actor::behavior_type {
    start(self, std::move(setup));
    self->set_down_handler([self](caf::down_msg& down) { on_member_down(self, down); });
    arm_member_deadline(self);
    if (self->state.stats.steps >= self->state.setup.total_steps)
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
        [self](join_atom, std::string& node, std::string& role, caf::actor& handle) {
          on_join(self, node, role, handle);
        },
        [self](caf::tick_atom) {
          auto& st = self->state;
          st.member_deadline_armed = false;
          if (st.rollouts.empty() && st.phase != run_phase::finished)
            end_run(self, 1,
                    "no rollout worker for " + std::to_string(st.setup.member_timeout.count() / 1000) +
                        " s; start a node with the rollout role (areal --config TOPOLOGY --node NAME)");
        },
    };
  });
}

}  // namespace areal
