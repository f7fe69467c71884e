// The course of the run, for the controller (see controller_state.hpp):
// batches to the trainer, each step's metrics and weights, evaluations,
// checkpoints, and the end of the run with every sample accounted for.
#include <algorithm>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "areal/runtime/log.hpp"
#include "controller_state.hpp"

namespace areal::controller_detail {

namespace {

std::map<std::string, int64_t> all_drops(const controller_state& st) {
  auto out = st.before.drop_reasons;
  for (auto& [reason, n] : st.ledger.drop_reasons())
    out[reason] += n;
  return out;
}

step_counters counters(controller_state& st) {
  refresh_counts(st);
  return {st.stats.steps,     st.stats.admitted,  st.stats.trained,
          st.stats.dropped,   st.gate->running(), st.buffer->ready_trajectories(),
          st.rollouts.size(), st.rewards.size()};
}

// Which of two saves of one sample's work keeps more: scored over generated over more tokens.
int64_t worth(const saved_sample& s) {
  if (s.scored)
    return INT64_MAX;
  auto& t = s.segments.front();
  return t.finish != finish_reason::unfinished ? INT64_MAX - 1 : static_cast<int64_t>(t.output_tokens.size());
}

// The work on the samples of the groups a checkpoint re-queues, gathered from
// where it is: the rollout workers (tokens so far; generated, not scored), the
// sample store (scored) and the prompt stream (saved work not sent out yet).
struct work_in_flight {
  std::map<sample_id, saved_sample> samples;
  size_t waiting = 0;  // replies still to come
  void add(saved_sample s) {
    auto& t = s.segments.front();
    auto [it, fresh] = samples.try_emplace(sample_id{t.group_id, t.sample_index}, s);
    if (!fresh && worth(s) > worth(it->second))
      it->second = std::move(s);
  }
  // Trajectories as a rollout worker or the store sends them (a sample's one after another).
  void add(std::vector<packed<trajectory>>& parts, bool scored) {
    std::optional<saved_sample> current;
    for (auto& bytes : parts) {
      auto t = unpack(bytes);
      if (!t)
        continue;
      if (current && (current->segments[0].group_id != t->group_id ||
                      current->segments[0].sample_index != t->sample_index || !scored)) {
        add(std::move(*current));
        current.reset();
      }
      if (!current)
        current = saved_sample{{}, scored};
      current->segments.push_back(std::move(*t));
    }
    if (current)
      add(std::move(*current));
  }
};

controller_checkpoint checkpoint_record(controller_state& st, const work_in_flight& work) {
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
  // The saved samples of the groups re-queued; the tokens of the scored ones
  // that were counted as generated are counted again when they are restored.
  std::set<uint64_t> requeued(c.requeue_groups.begin(), c.requeue_groups.end());
  int64_t counted = 0;
  for (auto& [id, sample] : work.samples) {
    bool from_later_weights = false;  // impossible but for work of a lost trainer's history: not saved
    for (auto& t : sample.segments)
      for (auto v : t.token_versions)
        from_later_weights |= v > c.version;
    if (requeued.count(id.group) == 0 || from_later_weights)
      continue;
    auto entry = st.ledger.where(id);
    if (sample.scored && entry && entry->stage == sample_stage::buffered)
      for (auto& t : sample.segments)
        counted += t.generated_tokens();
    c.saved.push_back(sample);
  }
  c.generated_tokens = st.generated_tokens - counted;
  c.trained_tokens = st.trained_tokens;
  c.elapsed_s = st.metrics->run_seconds();
  c.metrics_bytes = st.metrics->bytes();
  return c;
}

// Why a request to the trainer failed; a deadline that passed says which setting it was.
std::string trainer_failure(const controller_state& st, const std::string& what, const caf::error& err) {
  if (err == caf::sec::request_timeout)
    return "it did not " + what + " within " +
           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(st.setup.trainer_timeout).count()) +
           " s (cluster.trainer_timeout_s)";
  return describe(err);
}

// How long a checkpoint waits for a rollout worker's or the store's work in flight:
// a worker that does not answer in time (paused, lost) has its samples generated anew.
constexpr std::chrono::milliseconds gather_timeout{10000};

template <class F>
void gather_work(controller_pointer self, F then) {
  auto& st = self->state;
  auto work = std::make_shared<work_in_flight>();
  for (auto& s : st.stream->saved_work())
    work->add(std::move(s));
  if (st.setup.agent_episodes) {  // an episode's work is with its agent: it is played again
    then(*work);
    return;
  }
  auto timeout = std::min(gather_timeout, st.setup.request_timeout);
  auto handles = st.rollouts.handles();
  work->waiting = handles.size() + 1;
  // The store last: a sample that leaves a worker for the store while the
  // workers answer is found there.
  auto store_then = [self, work, then, timeout]() mutable {
    self->request(self->state.setup.store, timeout, snapshot_atom::value)
        .then(
            [work, then](std::vector<packed<trajectory>>& parts) mutable {
              work->add(parts, true);
              then(*work);
            },
            [work, then](caf::error& err) mutable {
              spdlog::warn(
                  "checkpoint: the sample store did not hand over its scored samples ({}); they are "
                  "generated again after a resume",
                  describe(err));
              then(*work);
            });
  };
  auto one_done = [work, store_then]() mutable {
    if (--work->waiting == 1)
      store_then();
  };
  if (handles.empty()) {
    store_then();
    return;
  }
  for (auto& h : handles)
    self->request(caf::actor_cast<rollout_actor>(h), timeout, snapshot_atom::value)
        .then(
            [work, one_done](std::vector<packed<trajectory>>& parts) mutable {
              work->add(parts, false);
              one_done();
            },
            [one_done](caf::error& err) mutable {
              spdlog::warn(
                  "checkpoint: a rollout worker did not hand over its samples in flight ({}); they are "
                  "generated again after a resume",
                  describe(err));
              one_done();
            });
}

// The checkpoint the trainer writes is on disk (or failed): the one due meanwhile, if any, starts.
template <class F>
void checkpoint_written(controller_pointer self, F& then, const std::string& failed) {
  auto& st = self->state;
  st.writing_checkpoint = false;
  then(failed);
  if (auto next = std::exchange(st.after_write, nullptr); next && st.phase != run_phase::finished)
    next();
}

template <class Taken, class F>
void write_checkpoint(controller_pointer self, const work_in_flight& work, Taken taken, F then) {
  auto& st = self->state;
  if (st.trainer_missing)
    return;  // lost while the work was gathered: its loss settled what waited for this
  auto epoch = st.trainer_epoch;
  auto failed = [self, epoch](F& continuation, caf::error& err) {
    if (self->state.trainer_epoch != epoch)
      return;
    auto why = trainer_failure(self->state, "write the checkpoint", err);
    spdlog::error("checkpoint failed: {}", why);
    checkpoint_written(self, continuation, why);
  };
  self->request(st.setup.trainer, st.setup.trainer_timeout, checkpoint_atom::value, st.setup.checkpoint_dir,
                checkpoint_record(st, work).to_bytes())
      .then(
          [self, taken, then, epoch, failed](int64_t) mutable {
            auto& s = self->state;
            if (s.trainer_epoch != epoch)
              return;
            // The trainer holds its copy: steps go on while it writes, one checkpoint at a time.
            s.checkpointing = false;
            s.writing_checkpoint = true;
            self->request(s.setup.trainer, s.setup.trainer_timeout, durable_atom::value)
                .then(
                    [self, then, epoch](int64_t version) mutable {
                      if (self->state.trainer_epoch != epoch)
                        return;
                      spdlog::info("checkpoint of version {} written to {}", version, self->state.setup.checkpoint_dir);
                      checkpoint_written(self, then, std::string{});
                    },
                    [then, failed](caf::error& err) mutable { failed(then, err); });
            taken();
          },
          [self, then, epoch, failed](caf::error& err) mutable {
            if (self->state.trainer_epoch == epoch)
              self->state.checkpointing = false;  // no copy was taken
            failed(then, err);
          });
}

// Saves the run (trainer state + this controller's record) at the current version.
// `taken` runs once the trainer holds its copy of the state (steps may go on),
// `then` once the checkpoint is on disk (with "") or failed (with the reason;
// the previous checkpoint is then the one on disk). A checkpoint due while the
// last one is still being written waits for it, and steps with it.
template <class Taken, class F>
void save_checkpoint(controller_pointer self, Taken taken, F then) {
  auto& st = self->state;
  if (st.setup.checkpoint_dir.empty()) {
    taken();
    then(std::string{});
    return;
  }
  st.checkpointing = true;
  auto start = [self, taken, then]() mutable {
    auto epoch = self->state.trainer_epoch;
    gather_work(self, [self, taken, then, epoch](const work_in_flight& work) mutable {
      if (self->state.trainer_epoch == epoch)  // else the trainer was lost meanwhile
        write_checkpoint(self, work, taken, then);
    });
  };
  if (st.writing_checkpoint)
    st.after_write = start;
  else
    start();
}

// An end was asked for while a step or a checkpoint was in flight: it happens now.
bool end_if_asked(controller_pointer self) {
  auto& st = self->state;
  if (st.phase != run_phase::draining || st.end_why.empty())
    return false;
  end_run(self, st.end_code, st.end_why);
  return true;
}

// The trainer's evaluator scores the current weights; one evaluation at a time
// (a busy evaluator skips this version).
void request_evaluation(controller_pointer self) {
  auto& st = self->state;
  if (st.evaluating)
    return;
  st.evaluating = true;
  auto epoch = st.trainer_epoch;
  self->request(st.setup.trainer, st.setup.trainer_timeout, eval_atom::value)
      .then(
          [self, epoch](int64_t version, double accuracy, double mean_tokens) {
            if (self->state.trainer_epoch != epoch)
              return;
            self->state.evaluating = false;
            self->state.metrics->eval(version, accuracy, mean_tokens);
            spdlog::info("held-out accuracy of version {}: {:.1f}%", version, 100 * accuracy);
          },
          [self, epoch](caf::error& err) {
            if (self->state.trainer_epoch != epoch)
              return;
            self->state.evaluating = false;
            spdlog::warn("evaluation skipped: {}", trainer_failure(self->state, "evaluate", err));
          });
}

void on_trained(controller_pointer self, const train_report& report, const batch_facts& facts) {
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
  st.metrics->step(facts, report, counters(st));
  if (!st.metrics->failure().empty()) {
    end_run(self, 1, st.metrics->failure() + "; the run stops here");
    return;
  }
  spdlog::debug("step {}/{}: version {}, reward {:.3f}, loss {:.4f}, staleness <= {}", st.stats.steps,
                st.setup.total_steps, report.version, report.reward_mean, report.loss, report.max_staleness);

  bool last = st.stats.steps >= st.setup.total_steps;
  if (st.setup.eval_every > 0 && st.stats.steps % st.setup.eval_every == 0 && !last)
    request_evaluation(self);
  if (last) {
    end_run(self, 0, "run complete");
    return;
  }
  if (end_if_asked(self))  // a stop arrived during the step
    return;
  if (st.setup.checkpoint_every > 0 && st.stats.steps % st.setup.checkpoint_every == 0)
    save_checkpoint(
        self,
        [self] {
          if (!end_if_asked(self))
            try_train(self);
        },
        [self](const std::string& failed) {
          if (!failed.empty())
            finish(self, 1,
                   "the checkpoint failed: " + failed + "; the run stops here, the previous checkpoint is kept");
        });
  else
    try_train(self);
  fill(self);
  // The step's metrics line made durable with the next step on its way.
  st.metrics->sync();
  if (!st.metrics->failure().empty())
    end_run(self, 1, st.metrics->failure() + "; the run stops here");
}

}  // namespace

void refresh_counts(controller_state& st) {
  st.stats.admitted = st.before.admitted + st.ledger.admitted();
  st.stats.trained = st.before.trained + st.ledger.trained_count();
  st.stats.dropped = st.before.dropped + st.ledger.dropped_count();
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
  spdlog::log(code == 0 ? spdlog::level::info : spdlog::level::err,
              "controller: {} ({} steps, {} samples trained, {} dropped)", why, st.stats.steps, st.stats.trained,
              st.stats.dropped);
  if (st.setup.listener)
    caf::anon_send(st.setup.listener, done_atom::value, code, why);
}

// Ends the run once no training step or checkpoint is in flight: final checkpoint, then done.
void end_run(controller_pointer self, int32_t code, const std::string& why) {
  auto& st = self->state;
  if (st.phase == run_phase::finished || st.phase == run_phase::saving)
    return;
  st.phase = run_phase::draining;
  st.end_code = code;
  st.end_why = why;
  if (st.trainer_missing) {  // no trainer to write a checkpoint: the last one on disk stays
    finish(self, code, why + "; the trainer is lost, its last checkpoint on disk stays");
    return;
  }
  if (st.training || st.checkpointing)
    return;                      // the step's reply (or the checkpoint's) ends the run
  st.phase = run_phase::saving;  // the final checkpoint starts once one being written is on disk
  save_checkpoint(
      self, [] {},
      [self](const std::string& failed) {
        auto& s = self->state;
        finish(self, failed.empty() ? s.end_code : 1,
               failed.empty() ? s.end_why : s.end_why + "; the final checkpoint failed (" + failed + ")");
      });
}

void try_train(controller_pointer self) {
  auto& st = self->state;
  if (st.training || st.checkpointing || st.phase == run_phase::saving || st.phase == run_phase::finished ||
      !trainer_ready(st))
    return;
  // Trained now, the batch produces version v + 1 from version v: tokens older
  // than v - eta would exceed the bound.
  auto batch = st.buffer->take_batch(st.setup.batch_size, st.gate->version() - st.setup.eta);
  settle_drops(self);
  if (!batch) {
    if (st.phase == run_phase::draining && st.gate->running() == 0 && !end_if_asked(self) && st.stream->waiting() == 0)
      end_run(self, 0, "the prompt stream is exhausted");
    return;
  }
  auto facts = describe_batch(*batch, st.gate->version());
  std::vector<uint64_t> slots;
  for (auto& t : *batch) {
    sample_id id{t.group_id, t.sample_index};
    st.ledger.batched(id, st.stats.steps + 1);
    st.in_training.push_back(id);
    if (auto position = st.stream->close_trained(t.group_id))
      facts.prompt_positions.push_back(*position);
    slots.push_back(t.slot);
  }
  st.training = true;
  auto epoch = st.trainer_epoch;
  self->request(st.setup.store, st.setup.trainer_timeout, train_atom::value, std::move(slots))
      .then(
          [self, facts, epoch](train_report& report) {
            if (self->state.trainer_epoch == epoch)  // else trained by a trainer since lost
              on_trained(self, report, facts);
          },
          [self, epoch](caf::error& err) {
            auto& s = self->state;
            if (s.trainer_epoch != epoch)
              return;
            s.training = false;
            auto step = "finish training step " + std::to_string(s.stats.steps + 1);
            finish(self, 1, "the trainer failed: " + trainer_failure(s, step, err));
          });
}

void weights_delivered(controller_pointer self, const std::vector<weight_delivery>& reports) {
  // One publication settled (every subscriber reported, failed, was lost or
  // missed the deadline): admission counts from its version now. Its reports
  // carry that version, or a newer one a subscriber caught up to, or none
  // (INT64_MAX) for a subscriber lost meanwhile.
  auto settled = INT64_MAX;
  for (auto& r : reports)
    settled = std::min(settled, r.version);
  self->state.gate->delivered(settled == INT64_MAX ? self->state.stats.version : settled);
  for (auto& r : reports) {
    if (!r.error.empty()) {
      self->state.metrics->transfer_failed();
      spdlog::warn("weights of version {} did not reach {}: {}", r.version, r.subscriber, r.error);
    } else if (r.backend != "in-process") {
      self->state.metrics->transferred(r.seconds);
    }
  }
  fill(self);
}

std::string ledger_json(const sample_ledger& ledger) {
  auto out = nlohmann::json::array();
  for (auto& e : ledger.entries())
    out.push_back({e.id.group, e.id.index, to_string(e.stage), e.holder, e.attempts, e.step, e.reason});
  return out.dump();
}

}  // namespace areal::controller_detail
