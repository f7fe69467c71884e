// The controller and its checkpoints (see controller_state.hpp): going back to
// a checkpoint's record (a resume, or a trainer that joined again), and the
// trainer on a node of its own lost and back. While it is lost nothing is
// admitted or trained and what was in flight is let go; a trainer that joins
// again started from the last checkpoint, so the run goes back to it (its saved
// work in flight continues) and goes on once every rollout worker samples with
// that checkpoint's weights: a token sampled with the lost trainer's later
// weights would carry a version of a history that no longer exists.
#include "areal/runtime/log.hpp"
#include "controller_state.hpp"

namespace areal::controller_detail {

namespace {

constexpr auto weights_poll_interval = std::chrono::milliseconds(200);

void say_saved_work(const controller_state& st, const controller_checkpoint& r) {
  if (r.saved.empty())
    return;
  int64_t generating = 0, tokens = 0, generated = 0, scored = 0;
  for (auto& saved : r.saved) {
    auto& t = saved.segments.front();
    if (static_cast<int64_t>(t.sample_index) >= st.setup.group_size)
      continue;  // let go (below)
    if (saved.scored)
      scored++;
    else if (t.finish == finish_reason::unfinished)
      generating++, tokens += static_cast<int64_t>(t.output_tokens.size());
    else
      generated++;
  }
  spdlog::info(
      "controller: the checkpoint saved the work of {} sample(s) in flight: {} generating ({} tokens so "
      "far, continued), {} generated (scored now), {} scored (trained as they are){}{}",
      r.saved.size(), generating, tokens, generated, scored,
      st.stream->saved_unused()
          ? "; " + std::to_string(st.stream->saved_unused()) + " no longer match their prompt and are generated anew"
          : std::string{},
      st.stream->saved_past_group() ? "; " + std::to_string(st.stream->saved_past_group()) +
                                          " are let go: their groups had more than rl.group_size = " +
                                          std::to_string(st.setup.group_size) + " samples in the run that saved them"
                                    : std::string{});
}

// Asks every rollout worker for the version its next token carries; the run
// goes on once all of them have the checkpoint's (the gate's) version.
void check_rollout_weights(controller_pointer self) {
  auto& st = self->state;
  if (!st.awaiting_weights || st.trainer_missing || st.phase == run_phase::finished)
    return;
  if (self->clock().now() - st.awaiting_since > st.setup.trainer_rejoin) {
    end_run(self, 1,
            "the rollout workers did not take the weights of the checkpoint the trainer started from within " +
                std::to_string(st.setup.trainer_rejoin.count() / 1000) + " s (cluster.trainer_rejoin_s)");
    return;
  }
  auto handles = st.rollouts.handles();
  auto behind = std::make_shared<size_t>(0);
  auto waiting = std::make_shared<size_t>(handles.size());
  auto epoch = st.trainer_epoch;
  auto all_answered = [self, behind, epoch]() {
    auto& s = self->state;
    if (s.trainer_epoch != epoch || !s.awaiting_weights)
      return;
    if (*behind > 0 || s.rollouts.empty()) {  // again shortly (a worker that joins takes them first)
      self->delayed_send(self, weights_poll_interval, trainer_atom::value, uint64_t{epoch});
      return;
    }
    s.awaiting_weights = false;
    spdlog::info("controller: every rollout worker has the weights of version {}; the run goes on", s.gate->version());
    try_train(self);
    fill(self);
  };
  if (handles.empty()) {
    all_answered();
    return;
  }
  auto version = st.gate->version();
  for (auto& h : handles)
    self->request(caf::actor_cast<rollout_actor>(h), weights_poll_interval * 10, weights_atom::value)
        .then(
            [behind, waiting, version, all_answered](int64_t next) {
              *behind += next != version;
              if (--*waiting == 0)
                all_answered();
            },
            [behind, waiting, all_answered](caf::error&) {  // a lost worker leaves the table
              ++*behind;
              if (--*waiting == 0)
                all_answered();
            });
}

}  // namespace

void go_back_to(controller_pointer self, const controller_checkpoint& r) {
  auto& st = self->state;
  auto& s = st.setup;
  // The metrics are cut back to the checkpoint: the steps after it are trained again.
  st.metrics.reset();
  std::optional<uint64_t> keep;
  if (r.metrics_bytes >= 0)
    keep = static_cast<uint64_t>(r.metrics_bytes);
  st.metrics = std::make_unique<run_metrics>(s.metrics_path, s.trace, r.elapsed_s, s.remote_weights, keep);
  // Counters continue from the checkpoint's; its unfinished groups come first, with their saved work.
  st.before = r;
  st.ledger = sample_ledger{};
  st.buffer = std::make_unique<group_buffer>(s.group_size);
  st.gate->restore(r.version);
  st.stats.version = r.version;
  st.stats.steps = r.steps;
  limit_admission(st);
  st.stats.max_staleness = r.max_staleness;
  st.stats.reward_mean_first = r.reward_mean_first;
  st.stats.reward_mean_last = r.reward_mean_last;
  st.stream->restore(r.stream());
  say_saved_work(st, r);
  st.generated_tokens = r.generated_tokens;
  st.trained_tokens = r.trained_tokens;
  st.in_training.clear();
  st.failures_in_row = 0;
  st.metrics->resume(r.version, r.steps, r.source_position, r.requeue.size());
  refresh_counts(st);
}

void trainer_lost(controller_pointer self, const std::string& why) {
  auto& st = self->state;
  if (st.trainer_missing || st.phase == run_phase::finished)
    return;
  st.trainer_missing = true;
  st.awaiting_weights = false;
  st.trainer_epoch++;  // replies of the lost trainer's requests are let go
  st.training = st.checkpointing = st.writing_checkpoint = st.evaluating = false;
  st.after_write = nullptr;
  // The samples in flight are let go: the run goes back to the last checkpoint,
  // which holds the work that was in flight then.
  st.rollouts.forget_requests();
  st.first_rid_of_epoch = st.next_rid;
  for (auto& h : st.rollouts.handles())  // their work would be sampled for a history that is gone
    self->send(caf::actor_cast<rollout_actor>(h), cancel_atom::value);
  st.rewards.forget_requests();
  spdlog::warn(
      "controller: the trainer is lost ({}); nothing is admitted or trained until a trainer joins again "
      "(the run then goes back to its last checkpoint)",
      why);
  if (!st.end_why.empty() || st.phase == run_phase::saving)  // an end was asked for: it comes without the trainer
    finish(self, st.end_code, st.end_why + "; the trainer was lost, its last checkpoint on disk stays");
}

void trainer_back(controller_pointer self, const caf::actor& trainer, const caf::actor& store,
                  const std::string& record) {
  auto& st = self->state;
  if (st.phase == run_phase::finished)
    return;
  controller_checkpoint r;
  try {
    r = controller_checkpoint::from_bytes(record, "the checkpoint the new trainer started from");
  } catch (const std::invalid_argument& e) {
    finish(self, 1, e.what());
    return;
  }
  if (!st.trainer_missing)
    trainer_lost(self, "a new trainer joined");
  st.setup.trainer = caf::actor_cast<trainer_actor>(trainer);
  st.setup.store = caf::actor_cast<sample_store_actor>(store);
  self->monitor(trainer);
  self->monitor(store);
  go_back_to(self, r);
  st.trainer_missing = false;
  st.awaiting_weights = true;
  st.awaiting_since = self->clock().now();
  spdlog::info(
      "controller: a trainer joined again from the checkpoint of version {} (step {}); waiting for the "
      "rollout workers to take its weights",
      r.version, r.steps);
  check_rollout_weights(self);
}

void poll_rollout_weights(controller_pointer self, uint64_t epoch) {
  if (self->state.trainer_epoch == epoch)
    check_rollout_weights(self);
}

}  // namespace areal::controller_detail
