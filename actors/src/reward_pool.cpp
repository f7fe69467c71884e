// The reward pool's dispatcher and workers.
#include "areal/actors/reward_pool.hpp"
#include "areal/actors/exception_guard.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <caf/all.hpp>

#include "areal/runtime/failpoints.hpp"
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

using scorer_fn = decltype(reward_pool_config::scorer);
using reward_run_atom = caf::atom_constant<caf::atom("rw_run")>;
using reward_scored_atom = caf::atom_constant<caf::atom("rw_scored")>;
using reward_tick_atom = caf::atom_constant<caf::atom("rw_tick")>;

// The pool's own interface: the public one, and what its worker threads and its clock send it
// (a verification's result: its job number and the scored trajectory or why there is none).
using reward_pool_impl = reward_pool_actor::extend<caf::reacts_to<reward_scored_atom, uint64_t, packed<trajectory>>,
                                                   caf::reacts_to<reward_scored_atom, uint64_t, caf::error>,
                                                   caf::reacts_to<reward_tick_atom>>;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

caf::expected<packed<trajectory>> with_verdict(trajectory t, const reward::verification& v) {
  t.reward = v.reward;
  t.judged = v.judged;
  t.verdict_detail = v.detail;
  t.timestamps.scored_ns = now_ns();
  return pack(t);
}

// What a worker needs of one verification; shared read-only between the pool and the worker that takes it.
struct ticket {
  uint64_t id;
  packed<trajectory> t;
  std::string response;
  packed<reward_task> task;
};

// The jobs waiting for a worker, oldest first. The pool puts them in; each idle worker
// thread takes the next itself, so a worker never waits on a round trip through the pool.
struct job_board {
  std::mutex m;
  std::condition_variable ready;
  std::deque<std::shared_ptr<const ticket>> waiting;
  bool closed = false;

  void put(std::shared_ptr<const ticket> t) {
    {
      std::lock_guard<std::mutex> lock{m};
      waiting.push_back(std::move(t));
    }
    ready.notify_one();
  }
  // The next job, or nothing once the board is closed or `cancel` is set.
  std::shared_ptr<const ticket> take(const std::atomic<bool>& cancel) {
    std::unique_lock<std::mutex> lock{m};
    // Bounded waits: a cancel set without a notification is still seen.
    while (!closed && !cancel.load() && waiting.empty())
      ready.wait_for(lock, std::chrono::milliseconds(200));
    if (closed || cancel.load() || waiting.empty())
      return nullptr;
    auto t = std::move(waiting.front());
    waiting.pop_front();
    return t;
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock{m};
      closed = true;
      waiting.clear();
    }
    ready.notify_all();
  }
};

// What the pool and one worker thread share: the worker's cancel flag and the job it runs.
struct worker_link {
  std::atomic<bool> cancel{false};
  std::atomic<uint64_t> job{0};        // the job being verified, 0 when idle
  std::atomic<int64_t> started_ns{0};  // when it began (steady clock)
};

// The failpoint reward.verifier_hang: a verification that never finishes by itself.
// It ends when the pool gives up on it (its deadline) or closes; ten minutes at most.
reward::verification hang_until_cancelled(const std::atomic<bool>& cancel) {
  auto until = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  while (!cancel.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return {verdict::error, 0.0f, "the verifier hung (failpoint reward.verifier_hang)"};
}

// A worker: on its own thread, it takes jobs from the board and verifies them one at a
// time until the board closes or the pool cancels it (it then ends after the job in hand).
caf::behavior reward_worker(caf::event_based_actor* self, std::shared_ptr<job_board> board,
                            std::shared_ptr<worker_link> link, scorer_fn scorer, reward_pool_impl pool,
                            std::shared_ptr<tracer> trace, std::string track) {
  guard_exceptions(self, "reward worker " + track);
  return {[=](reward_run_atom) {
    while (auto job = board->take(link->cancel)) {
      link->started_ns.store(steady_ns());
      link->job.store(job->id);
      caf::expected<packed<trajectory>> scored = caf::error{};
      {
        tracer::scope span{trace.get(), track, "reward"};
        auto traj = unpack(job->t);
        auto spec = traj ? unpack(job->task) : caf::expected<reward_task>{traj.error()};
        if (!traj || !spec) {
          scored = traj ? spec.error() : traj.error();
        } else {
          traj->timestamps.scoring_start_ns = now_ns();
          reward::verification v;
          try {
            v = scorer(job->response, *spec, link->cancel);
          } catch (const std::exception& e) {
            v = {verdict::error, 0.0f, std::string{"the verifier failed: "} + e.what()};
          } catch (...) {
            v = {verdict::error, 0.0f, "the verifier failed with a non-standard exception"};
          }
          scored = with_verdict(std::move(*traj), v);
        }
      }
      link->job.store(0);
      if (link->cancel.load())
        break;  // retired at its deadline: the pool has answered for this job
      if (scored)
        self->send(pool, reward_scored_atom::value, job->id, std::move(*scored));
      else
        self->send(pool, reward_scored_atom::value, job->id, std::move(scored.error()));
    }
    self->quit();
  }};
}

// One accepted verification. Its answer goes back to the requester, or, with a sample
// store, the scored trajectory goes on to the store, whose summary is the answer.
struct job {
  std::shared_ptr<const ticket> work;
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
  caf::actor handle;
  std::shared_ptr<worker_link> link;
};

struct pool_state {
  static inline const char* name = "areal.reward_pool";
  reward_pool_config config;
  std::shared_ptr<job_board> board = std::make_shared<job_board>();
  std::vector<worker_slot> workers;
  uint64_t workers_made = 0;
  uint64_t next_job = 1;
  std::unordered_map<uint64_t, job> pending;  // accepted, not yet answered
  bool ticking = false;
  reward_pool_stats stats;
  std::shared_ptr<std::vector<std::shared_ptr<worker_link>>> all_links =
      std::make_shared<std::vector<std::shared_ptr<worker_link>>>();
};

using pool_pointer = reward_pool_impl::stateful_pointer<pool_state>;

worker_slot make_worker(pool_pointer self) {
  auto link = std::make_shared<worker_link>();
  auto track = "reward-" + std::to_string(self->state.workers_made++);
  auto handle = self->system().spawn<caf::detached>(reward_worker, self->state.board, link, self->state.config.scorer,
                                                    reward_pool_impl{self}, self->state.config.trace, track);
  self->monitor(handle);
  self->state.all_links->push_back(link);
  caf::anon_send(handle, reward_run_atom::value);
  return {handle, link};
}

void refresh_counts(pool_pointer self) {
  auto& st = self->state;
  st.stats.busy = static_cast<uint64_t>(
      std::count_if(st.workers.begin(), st.workers.end(), [](auto& w) { return w.link->job.load() != 0; }));
  st.stats.queued = st.pending.size() > st.stats.busy ? st.pending.size() - st.stats.busy : 0;
  st.stats.workers = st.workers.size();
}

// Answers a job with a verdict of the pool's own (its worker missed the deadline or failed).
void answer_failed(job& j, verdict judged, const std::string& detail) {
  auto traj = unpack(j.work->t);
  if (!traj) {
    j.answer(traj.error());
    return;
  }
  j.answer(with_verdict(std::move(*traj), {judged, 0.0f, detail}));
}

// The deadline check runs while work is pending, often enough to be late by a twentieth at most.
caf::timespan tick_interval(const pool_state& st) {
  auto ms = std::clamp(st.config.timeout_s * 1000.0 / 20.0, 5.0, 250.0);
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double, std::milli>(ms));
}

void keep_ticking(pool_pointer self) {
  auto& st = self->state;
  if (st.ticking || st.pending.empty())
    return;
  st.ticking = true;
  self->delayed_send(self, tick_interval(st), reward_tick_atom::value);
}

// The worker is done for: it is cancelled (its thread ends when the job in hand returns) and replaced.
void replace_worker(pool_pointer self, worker_slot& w, const std::string& why) {
  w.link->cancel.store(true);
  self->demonitor(w.handle);
  w = make_worker(self);
  self->state.stats.replaced++;
  spdlog::warn("reward worker retired after {}; replaced", why);
}

// Every running verification past the pool's deadline is answered with a timeout verdict.
void check_deadlines(pool_pointer self) {
  auto& st = self->state;
  auto limit = static_cast<int64_t>(st.config.timeout_s * 1e9);
  auto now = steady_ns();
  for (auto& w : st.workers) {
    auto id = w.link->job.load();
    if (id == 0 || now - w.link->started_ns.load() < limit)
      continue;
    auto it = st.pending.find(id);
    if (it == st.pending.end())
      continue;
    st.stats.timeouts++;
    st.stats.scored++;
    answer_failed(it->second, verdict::timeout,
                  "verification exceeded the pool's deadline of " + fmt::format("{:g}", st.config.timeout_s) + " s");
    st.pending.erase(it);
    replace_worker(self, w, "missing its deadline");
  }
}

// The back-pressure: a refusal when queue_capacity verifications are pending (checked
// before a response promise is made: a promise made takes over the reply).
std::optional<caf::error> full(pool_pointer self) {
  auto& st = self->state;
  if (st.pending.size() < st.config.queue_capacity)
    return std::nullopt;
  st.stats.refused++;
  return caf::make_error(reward_errc::queue_full,
                         std::to_string(st.config.queue_capacity) +
                             " verifications are pending (reward.queue_capacity); send again after a reply");
}

// Puts an accepted job on the board.
void accept(pool_pointer self, job j, packed<trajectory>& t, std::string& response, packed<reward_task>& task) {
  auto& st = self->state;
  auto id = st.next_job++;
  j.work = std::make_shared<const ticket>(ticket{id, std::move(t), std::move(response), std::move(task)});
  auto work = j.work;
  st.pending.emplace(id, std::move(j));
  st.board->put(std::move(work));
  keep_ticking(self);
}

void on_result(pool_pointer self, uint64_t id, caf::expected<packed<trajectory>> scored) {
  auto& st = self->state;
  auto it = st.pending.find(id);
  if (it == st.pending.end())
    return;  // answered already (its deadline passed just as it finished)
  if (scored)
    st.stats.scored++;
  else
    st.stats.errors++;  // the request itself was unreadable
  it->second.answer(std::move(scored));
  st.pending.erase(it);
}

// A worker thread that ended by itself (it cannot, short of a crash): its job gets an error verdict.
void on_worker_down(pool_pointer self, const caf::down_msg& down) {
  auto& st = self->state;
  for (auto& w : st.workers) {
    if (w.handle.address() != down.source)
      continue;
    if (auto it = st.pending.find(w.link->job.load()); it != st.pending.end()) {
      st.stats.errors++;
      st.stats.scored++;
      answer_failed(it->second, verdict::error, "the reward worker failed: " + describe(down.reason));
      st.pending.erase(it);
    }
    replace_worker(self, w, describe(down.reason));
    return;
  }
}

reward_pool_impl::behavior_type reward_pool(pool_pointer self, reward_pool_config config) {
  guard_exceptions(self, "reward pool");
  auto& state = self->state;
  if (!config.scorer) {
    auto options = config.scoring;
    config.scorer = [options](const std::string& response, const reward_task& task, const std::atomic<bool>& cancel) {
      if (failpoints::fire("reward.verifier_hang"))
        return hang_until_cancelled(cancel);
      return reward::score_response(response, task, options, &cancel);
    };
  }
  state.config = std::move(config);
  for (size_t i = 0; i < std::max<size_t>(1, state.config.workers); ++i)
    state.workers.push_back(make_worker(self));
  refresh_counts(self);
  self->set_down_handler([self](caf::down_msg& down) { on_worker_down(self, down); });
  // On exit, close the board and cancel running verifications so that the worker threads end promptly.
  self->attach_functor([board = state.board, links = state.all_links](const caf::error&) {
    board->close();
    for (auto& l : *links)
      l->cancel.store(true);
  });
  return {
      [self](packed<trajectory>& t, std::string& response,
             packed<reward_task>& task) -> caf::result<packed<trajectory>> {
        if (auto refusal = full(self))
          return std::move(*refusal);
        job j{{}, self->make_response_promise<packed<trajectory>>(), {}, {}};
        auto promise = j.promise;
        accept(self, std::move(j), t, response, task);
        return promise;
      },
      [self](packed<trajectory>& t, std::string& response, packed<reward_task>& task,
             caf::actor& store) -> caf::result<sample_summary> {
        if (!store)
          return caf::make_error(caf::sec::invalid_argument, "reward pool: no sample store to hand the result to");
        if (auto refusal = full(self))
          return std::move(*refusal);
        job j{{}, {}, self->make_response_promise<sample_summary>(), caf::actor_cast<sample_store_actor>(store)};
        auto forward = j.forward;
        accept(self, std::move(j), t, response, task);
        return forward;
      },
      [self](stats_atom) {
        refresh_counts(self);
        return self->state.stats;
      },
      [self](reward_scored_atom, uint64_t id, packed<trajectory>& scored) { on_result(self, id, std::move(scored)); },
      [self](reward_scored_atom, uint64_t id, caf::error& err) { on_result(self, id, std::move(err)); },
      [self](reward_tick_atom) {
        self->state.ticking = false;
        check_deadlines(self);
        keep_ticking(self);
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
