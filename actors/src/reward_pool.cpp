// The reward pool's dispatcher and workers.
#include "areal/actors/reward_pool.hpp"

#include <chrono>
#include <deque>
#include <optional>

#include <caf/all.hpp>

#include "areal/runtime/log.hpp"

namespace areal {

const char* to_string(reward_errc x) {
  switch (x) {
    case reward_errc::queue_full:
      return "queue_full";
  }
  return "unknown";
}

namespace {

using reward_worker_actor =
    caf::typed_actor<caf::replies_to<packed<trajectory>, std::string, packed<reward_task>>::with<packed<trajectory>>>;
using scorer_fn = decltype(reward_pool_config::scorer);

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

caf::expected<packed<trajectory>> with_verdict(trajectory t, const reward::verification& v) {
  t.reward = v.reward;
  t.judged = v.judged;
  t.verdict_detail = v.detail;
  t.timestamps.scored_ns = now_ns();
  return pack(t);
}

// A worker runs one verification at a time on its own thread.
reward_worker_actor::behavior_type reward_worker(reward_worker_actor::pointer,
                                                 std::shared_ptr<std::atomic<bool>> cancel, scorer_fn scorer,
                                                 std::shared_ptr<tracer> trace, std::string track) {
  return {[cancel, scorer, trace, track](packed<trajectory>& t, std::string& response,
                                         packed<reward_task>& task) -> caf::result<packed<trajectory>> {
    tracer::scope span{trace.get(), track, "reward"};
    auto traj = unpack(t);
    if (!traj)
      return std::move(traj.error());
    auto spec = unpack(task);
    if (!spec)
      return std::move(spec.error());
    traj->timestamps.scoring_start_ns = now_ns();
    reward::verification v;
    try {
      v = scorer(response, *spec, *cancel);
    } catch (const std::exception& e) {
      v = {verdict::error, 0.0f, std::string{"the verifier failed: "} + e.what()};
    } catch (...) {
      v = {verdict::error, 0.0f, "the verifier failed with a non-standard exception"};
    }
    auto scored = with_verdict(std::move(*traj), v);
    if (!scored)
      return std::move(scored.error());
    return std::move(*scored);
  }};
}

// One verification. Its answer goes back to the requester, or, with a sample
// store, the scored trajectory goes on to the store, whose summary is the answer.
struct job {
  packed<trajectory> t;
  std::string response;
  packed<reward_task> task;
  caf::typed_response_promise<packed<trajectory>> promise;
  caf::typed_response_promise<sample_summary> forward;
  sample_store_actor store;

  void answer(caf::expected<packed<trajectory>> scored) {
    if (!store)
      scored ? promise.deliver(std::move(*scored)) : promise.deliver(scored.error());
    else if (scored)
      forward.delegate(store, std::move(*scored));
    else
      forward.deliver(scored.error());
  }
};

struct worker_slot {
  reward_worker_actor handle;
  std::shared_ptr<std::atomic<bool>> cancel;
  bool busy = false;
};

struct pool_state {
  static inline const char* name = "areal.reward_pool";
  reward_pool_config config;
  std::vector<worker_slot> workers;
  uint64_t workers_made = 0;
  std::deque<job> queue;
  reward_pool_stats stats;
  std::shared_ptr<std::vector<std::shared_ptr<std::atomic<bool>>>> all_cancels =
      std::make_shared<std::vector<std::shared_ptr<std::atomic<bool>>>>();
};

using pool_pointer = reward_pool_actor::stateful_pointer<pool_state>;

worker_slot make_worker(pool_pointer self) {
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  auto track = "reward-" + std::to_string(self->state.workers_made++);
  auto handle = self->system().spawn<caf::detached>(reward_worker, cancel, self->state.config.scorer,
                                                    self->state.config.trace, track);
  self->link_to(handle);  // workers end with the pool
  self->state.all_cancels->push_back(cancel);
  return {handle, cancel, false};
}

worker_slot* find_worker(pool_pointer self, const reward_worker_actor& handle) {
  for (auto& w : self->state.workers)
    if (w.handle == handle)
      return &w;
  return nullptr;
}

void refresh_counts(pool_pointer self) {
  auto& st = self->state;
  st.stats.queued = st.queue.size();
  st.stats.busy =
      static_cast<uint64_t>(std::count_if(st.workers.begin(), st.workers.end(), [](auto& w) { return w.busy; }));
  st.stats.workers = st.workers.size();
}

void dispatch(pool_pointer self);

// Answers a job whose worker failed (deadline or crash) with a verdict of the pool's own.
void answer_failed(pool_pointer, job& j, verdict judged, const std::string& detail) {
  auto traj = unpack(j.t);
  if (!traj) {
    j.answer(traj.error());
    return;
  }
  j.answer(with_verdict(std::move(*traj), {judged, 0.0f, detail}));
}

void start_job(pool_pointer self, worker_slot& slot) {
  auto& state = self->state;
  auto j = std::make_shared<job>(std::move(state.queue.front()));
  state.queue.pop_front();
  slot.busy = true;
  auto handle = slot.handle;
  auto timeout = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(state.config.timeout_s));
  self->request(handle, timeout, j->t, j->response, j->task)
      .then(
          [self, j, handle](packed<trajectory>& scored) {
            auto& st = self->state;
            st.stats.scored++;
            j->answer(std::move(scored));
            if (auto* w = find_worker(self, handle))
              w->busy = false;
            dispatch(self);
          },
          [self, j, handle](caf::error& err) {
            auto& st = self->state;
            if (err.category() == caf::atom("wire")) {  // the request itself was unreadable
              st.stats.errors++;
              j->answer(err);
              if (auto* w = find_worker(self, handle))
                w->busy = false;
              dispatch(self);
              return;
            }
            // Deadline missed or worker gone: answer for it, then retire it and put a fresh one in its place.
            bool timed_out = err == caf::sec::request_timeout;
            if (timed_out)
              st.stats.timeouts++;
            else
              st.stats.errors++;
            st.stats.scored++;
            answer_failed(
                self, *j, timed_out ? verdict::timeout : verdict::error,
                timed_out ? "verification exceeded the pool's deadline of " + std::to_string(st.config.timeout_s) + " s"
                          : "the reward worker failed: " + describe(err));
            if (auto* w = find_worker(self, handle)) {
              w->cancel->store(true);
              self->unlink_from(w->handle);
              self->send_exit(w->handle,
                              caf::exit_reason::user_shutdown);  // takes effect when its verification returns
              *w = make_worker(self);
              st.stats.replaced++;
              spdlog::warn("reward worker retired after {}; replaced",
                           timed_out ? "missing its deadline" : describe(err));
            }
            dispatch(self);
          });
}

void dispatch(pool_pointer self) {
  auto& st = self->state;
  for (auto& w : st.workers) {
    if (st.queue.empty())
      break;
    if (!w.busy)
      start_job(self, w);
  }
  refresh_counts(self);
}

// The back-pressure: a refusal when queue_capacity verifications are pending.
std::optional<caf::error> full(pool_pointer self) {
  auto& st = self->state;
  refresh_counts(self);
  if (st.stats.queued + st.stats.busy < st.config.queue_capacity)
    return std::nullopt;
  st.stats.refused++;
  return caf::make_error(reward_errc::queue_full,
                         std::to_string(st.config.queue_capacity) +
                             " verifications are pending (reward.queue_capacity); send again after a reply");
}

reward_pool_actor::behavior_type reward_pool(pool_pointer self, reward_pool_config config) {
  auto& state = self->state;
  if (!config.scorer) {
    auto options = config.scoring;
    config.scorer = [options](const std::string& response, const reward_task& task, const std::atomic<bool>& cancel) {
      return reward::score_response(response, task, options, &cancel);
    };
  }
  state.config = std::move(config);
  for (size_t i = 0; i < std::max<size_t>(1, state.config.workers); ++i)
    state.workers.push_back(make_worker(self));
  refresh_counts(self);
  // On exit, cancel running verifications so that the worker threads end promptly.
  self->attach_functor([cancels = state.all_cancels](const caf::error&) {
    for (auto& c : *cancels)
      c->store(true);
  });
  return {
      [self](packed<trajectory>& t, std::string& response,
             packed<reward_task>& task) -> caf::result<packed<trajectory>> {
        if (auto refusal = full(self))
          return std::move(*refusal);
        job j{std::move(t),
              std::move(response),
              std::move(task),
              self->make_response_promise<packed<trajectory>>(),
              {},
              {}};
        self->state.queue.push_back(j);
        dispatch(self);
        return j.promise;
      },
      [self](packed<trajectory>& t, std::string& response, packed<reward_task>& task,
             caf::actor& store) -> caf::result<sample_summary> {
        if (auto refusal = full(self))
          return std::move(*refusal);
        if (!store)
          return caf::make_error(caf::sec::invalid_argument, "reward pool: no sample store to hand the result to");
        job j{std::move(t),
              std::move(response),
              std::move(task),
              {},
              self->make_response_promise<sample_summary>(),
              caf::actor_cast<sample_store_actor>(store)};
        self->state.queue.push_back(j);
        dispatch(self);
        return j.forward;
      },
      [self](stats_atom) {
        refresh_counts(self);
        return self->state.stats;
      },
  };
}

}  // namespace

reward_pool_config make_reward_pool_config(const reward_spec& spec) {
  reward_pool_config c;
  c.workers = spec.workers;
  c.queue_capacity = spec.queue_capacity;
  c.timeout_s = spec.timeout_s;
  c.scoring.math.relative_tolerance = spec.math_relative_tolerance;
  c.scoring.math.unmarked_fallback = spec.math_unmarked_fallback;
  c.scoring.math.chain_answers_interval = spec.math_chain_answers_interval;
  c.scoring.countdown.use_all_numbers = spec.countdown_use_all_numbers;
  c.scoring.code.python = spec.python;
  c.scoring.code.policy.uid_base = spec.sandbox_uid_base;
  c.scoring.code.policy.uid_slots = spec.sandbox_uid_slots;
  c.scoring.code.limits.memory_bytes = spec.memory_mb << 20;
  c.scoring.code.limits.output_bytes = spec.output_kb << 10;
  return c;
}

reward_pool_actor spawn_reward_pool(caf::actor_system& sys, reward_pool_config config) {
  return sys.spawn(reward_pool, std::move(config));
}

}  // namespace areal
