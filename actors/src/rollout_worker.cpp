// The rollout worker's behaviour: requests are queued into the engine, and the
// worker steps the engine by sending itself `step` messages; whatever arrives
// meanwhile (requests, weights) is handled between two steps.
#include <ATen/Parallel.h>

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include <caf/all.hpp>

#include "areal/actors/exception_guard.hpp"
#include "areal/actors/rollout.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/runtime/log.hpp"

namespace areal {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Where a finished sample goes: back to the requester (generation only), or on
// to a reward pool that hands it to a sample store.
struct route {
  caf::typed_response_promise<sample_summary> promise;
  packed<reward_task> task;
  reward_pool_actor pool;
  caf::actor store;
};

struct pending {
  caf::typed_response_promise<packed<trajectory>, std::string> promise;
  generation_request request;
  int64_t started_ns;
  std::optional<route> to_pool;
  caf::actor listener;  // streamed: told the new tokens after every step
  size_t streamed = 0;  // tokens the listener has
};

// A generated sample on its way to its reward pool, kept while the pool's queue is full.
struct outgoing {
  route to;
  packed<trajectory> t;
  std::string text;
  std::chrono::steady_clock::time_point first_refused;
};

constexpr auto pool_retry_interval = std::chrono::milliseconds(5);

struct rollout_state {
  static inline const char* name = "areal.rollout";
  rollout_setup setup;
  std::unique_ptr<kernels::generation_engine> engine;
  // What the engine did, once, when the worker ends.
  ~rollout_state() {
    if (!engine || engine->counters().steps == 0)
      return;
    auto& c = engine->counters();
    spdlog::info(
        "rollout {}: {} steps, {} tokens sampled; prompt tokens computed {} (prefill) + {} (re-prefill after "
        "{} interruptions); {} prompt tokens read from the shared prompt pool, {} copied into it; {} first tokens "
        "sampled from a pool entry's logits",
        setup.name, c.steps, c.decode_tokens, c.prefill_tokens, c.reprefill_tokens, c.interruptions,
        c.shared_prompt_tokens, c.pool_copied_tokens, c.pool_first_tokens);
  }
  std::map<uint64_t, pending> in_flight;  // by engine job id
  uint64_t next_job = 0;
  bool stepping = false;
  bool busy = false;             // counted as busy in the compute share
  std::deque<outgoing> refused;  // waiting for room in their reward pool
  // Generated samples a reward pool has (until it answers): what a checkpoint saves of them.
  std::set<std::shared_ptr<outgoing>> at_pool;
  bool retry_armed = false;
};

using rollout_pointer = rollout_actor::stateful_pointer<rollout_state>;

void keep_stepping(rollout_pointer self) {
  auto& st = self->state;
  if (st.setup.share)
    st.setup.share->set_busy(st.busy, !st.engine->idle());
  if (!st.stepping && !st.engine->idle()) {
    st.stepping = true;
    self->send(self, step_atom::value);
  }
}

void deliver(rollout_pointer self, kernels::generation_output& out);

void fail(pending& p, const caf::error& err) {
  if (p.to_pool)
    p.to_pool->promise.deliver(err);
  else
    p.promise.deliver(err);
}

void send_to_pool(rollout_pointer self, outgoing o);

void traced_step(rollout_pointer self) {
  auto& st = self->state;
  auto before = st.engine->counters();
  auto start = trace_clock_ns();
  auto cpu_start = st.setup.trace ? thread_cpu_ns() : 0;  // a system call each: only for the trace
  auto outputs = st.engine->step();
  auto end = trace_clock_ns();
  auto cpu_ns = st.setup.trace ? thread_cpu_ns() - cpu_start : 0;
  if (st.setup.trace) {
    auto& after = st.engine->counters();
    auto apply_ns = static_cast<int64_t>((after.weight_apply_seconds - before.weight_apply_seconds) * 1e9);
    if (apply_ns > 0)
      st.setup.trace->span(st.setup.name, "weight sync", start, start + apply_ns);
    // What the step computed, in the terms of the simulator's cost model (a replay fits it).
    auto delta = [](uint64_t a, uint64_t b) { return static_cast<int64_t>(a - b); };
    st.setup.trace->span(st.setup.name, "generate", start + apply_ns, end,
                         {{"batch", delta(after.decode_rows, before.decode_rows)},
                          {"context", delta(after.decode_context_tokens, before.decode_context_tokens)},
                          {"prefill", delta(after.prefill_tokens + after.reprefill_tokens,
                                            before.prefill_tokens + before.reprefill_tokens)},
                          {"attended", delta(after.prefill_attended_tokens, before.prefill_attended_tokens)},
                          // This thread's CPU in the step (a weight apply's included); on more
                          // than one thread the other threads' is not in it.
                          {"cpu_us", cpu_ns / 1000}});
  }
  for (auto& [id, p] : st.in_flight) {
    if (!p.listener)
      continue;
    auto* so_far = st.engine->running_output(id);
    if (so_far && so_far->tokens.size() > p.streamed) {
      caf::anon_send(
          p.listener, stream_atom::value,
          std::vector<int32_t>(so_far->tokens.begin() + static_cast<std::ptrdiff_t>(p.streamed), so_far->tokens.end()));
      p.streamed = so_far->tokens.size();
    }
  }
  for (auto& out : outputs)
    deliver(self, out);
}

// The trajectory of a request with the output it has.
trajectory trajectory_of(const rollout_state& st, const pending& p, const kernels::generation_output& out) {
  trajectory t;
  t.prompt_id = p.request.prompt_id;
  t.group_id = p.request.group_id;
  t.sample_index = p.request.sample_index;
  t.prompt_tokens = p.request.prompt_tokens;
  t.output_tokens = out.tokens;
  t.behaviour_logprobs = out.logprobs;
  t.token_versions = out.versions;
  t.finish = out.finish;
  t.producer = st.setup.name;
  t.prompt_version = p.request.admitted_version;
  t.timestamps.generation_start_ns = p.started_ns;
  return t;
}

// What a checkpoint saves of the samples here that go to a reward pool: the
// tokens so far of those generating (those still queued: the output they came
// with), and the generated ones a pool has not answered for.
std::vector<packed<trajectory>> snapshot(const rollout_state& st) {
  std::vector<packed<trajectory>> out;
  auto add = [&out](const trajectory& t) {
    if (auto bytes = pack(t))
      out.push_back(std::move(*bytes));
  };
  for (auto& [id, p] : st.in_flight) {
    if (!p.to_pool)
      continue;
    kernels::generation_output so_far;
    if (auto* running = st.engine->running_output(id)) {
      so_far = *running;
    } else {
      so_far.tokens = p.request.so_far.tokens;
      so_far.logprobs = p.request.so_far.logprobs;
      so_far.versions = p.request.so_far.versions;
    }
    if (!so_far.tokens.empty()) {
      so_far.finish = finish_reason::unfinished;
      add(trajectory_of(st, p, so_far));
    }
  }
  for (auto& o : st.at_pool)
    out.push_back(o->t);
  for (auto& o : st.refused)
    out.push_back(o.t);
  return out;
}

void deliver(rollout_pointer self, kernels::generation_output& out) {
  auto& st = self->state;
  auto it = st.in_flight.find(out.id);
  if (it == st.in_flight.end())
    return;
  auto& p = it->second;
  auto t = trajectory_of(st, p, out);
  t.timestamps.generation_end_ns = now_ns();
  if (out.finish == finish_reason::aborted) {
    // Never scored or trained: the controller generates it again.
    auto err = caf::make_error(caf::sec::runtime_error,
                               "rollout " + st.setup.name + ": the sequence was aborted by its engine");
    fail(p, err);
    st.in_flight.erase(it);
    return;
  }
  std::string text = st.setup.tokenizer ? st.setup.tokenizer->decode(out.tokens, true) : std::string{};
  auto packed_t = pack(t);
  if (!packed_t) {
    fail(p, packed_t.error());
  } else if (p.to_pool) {
    send_to_pool(self, {std::move(*p.to_pool), std::move(*packed_t), std::move(text), {}});
  } else {
    p.promise.deliver(std::move(*packed_t), std::move(text));
  }
  st.in_flight.erase(it);
}

void arm_retry(rollout_pointer self) {
  auto& st = self->state;
  if (st.retry_armed || st.refused.empty())
    return;
  st.retry_armed = true;
  self->delayed_send(self, pool_retry_interval, caf::tick_atom::value);
}

// The trajectory goes to its reward pool, which hands the scored one to the
// store; the store's summary answers the controller. A full pool is asked
// again (after other replies, or shortly), never longer than the scoring deadline.
void send_to_pool(rollout_pointer self, outgoing o) {
  // The message takes a copy; `held` keeps the original for an offer again.
  auto held = std::make_shared<outgoing>(std::move(o));
  self->state.at_pool.insert(held);
  self->request(held->to.pool, self->state.setup.score_timeout, held->t, held->text, held->to.task, held->to.store)
      .then(
          [self, held](sample_summary& summary) {
            if (self->state.at_pool.erase(held) == 0)
              return;  // cancelled meanwhile
            held->to.promise.deliver(std::move(summary));
            // A reply freed a place in a pool: the oldest refused sample goes now.
            auto& st = self->state;
            if (!st.refused.empty()) {
              auto next = std::move(st.refused.front());
              st.refused.pop_front();
              send_to_pool(self, std::move(next));
            }
          },
          [self, held](caf::error& err) {
            auto& st = self->state;
            if (st.at_pool.erase(held) == 0)
              return;  // cancelled meanwhile
            bool queue_full =
                err.category() == caf::atom("reward") && err.code() == static_cast<uint8_t>(reward_errc::queue_full);
            auto now = std::chrono::steady_clock::now();
            if (queue_full && held->first_refused == std::chrono::steady_clock::time_point{})
              held->first_refused = now;
            if (!queue_full || now - held->first_refused > st.setup.score_timeout) {
              held->to.promise.deliver(
                  queue_full ? caf::make_error(caf::sec::request_timeout,
                                               "rollout " + st.setup.name + ": the reward pool stayed full for " +
                                                   std::to_string(st.setup.score_timeout.count()) + " ms")
                             : err);
              return;
            }
            st.refused.push_back(std::move(*held));
            arm_retry(self);
          });
}

// A request into the engine; an error when the engine cannot take it.
std::optional<caf::error> submit(rollout_pointer self, packed<generation_request>& msg,
                                 caf::typed_response_promise<packed<trajectory>, std::string> promise,
                                 std::optional<route> to_pool, caf::actor listener = {}) {
  auto& st = self->state;
  auto request = unpack(msg);
  if (!request)
    return std::move(request.error());
  kernels::generation_job job;
  job.id = st.next_job++;
  job.prompt = request->prompt_tokens;
  job.sampling = request->sampling;
  job.seed = request->seed;
  // Saved finished by a checkpoint: generated already, only its scoring is left.
  bool generated = request->so_far.finish != finish_reason::unfinished;
  if (!generated) {
    job.so_far = request->so_far;
    try {
      st.engine->submit(job);
    } catch (const std::invalid_argument& e) {
      return caf::make_error(caf::sec::invalid_argument, std::string{"rollout "} + st.setup.name + ": " + e.what());
    }
  }
  auto& so_far = request->so_far;
  kernels::generation_output out{job.id, job.prompt, so_far.tokens, so_far.logprobs, so_far.versions, so_far.finish};
  st.in_flight.emplace(
      job.id, pending{std::move(promise), std::move(*request), now_ns(), std::move(to_pool), std::move(listener), 0});
  if (generated)
    deliver(self, out);
  keep_stepping(self);
  return std::nullopt;
}

rollout_actor::behavior_type rollout_behavior(rollout_pointer self, rollout_setup setup) {
  guard_exceptions(self, "rollout " + setup.name);
  self->state.setup = std::move(setup);
  auto& s = self->state.setup;
  self->state.engine = std::make_unique<kernels::generation_engine>(*s.model, s.engine, s.initial_version);
  return {
      [self](packed<generation_request>& msg, packed<reward_task>& task, caf::actor& pool,
             caf::actor& store) -> caf::result<sample_summary> {
        if (!pool || !store)
          return caf::make_error(caf::sec::invalid_argument,
                                 "rollout " + self->state.setup.name + ": a request names no reward pool or store");
        auto promise = self->make_response_promise<sample_summary>();
        route to{promise, std::move(task), caf::actor_cast<reward_pool_actor>(pool), std::move(store)};
        if (auto err = submit(self, msg, {}, std::move(to)))
          promise.deliver(*err);  // the promise holds the request now: the error goes through it
        return promise;
      },
      [self](packed<generation_request>& msg) -> caf::result<packed<trajectory>, std::string> {
        auto promise = self->make_response_promise<packed<trajectory>, std::string>();
        if (auto err = submit(self, msg, promise, std::nullopt))
          promise.deliver(*err);
        return promise;
      },
      [self](stream_atom, packed<generation_request>& msg,
             caf::actor& listener) -> caf::result<packed<trajectory>, std::string> {
        auto promise = self->make_response_promise<packed<trajectory>, std::string>();
        if (auto err = submit(self, msg, promise, std::nullopt, listener))
          promise.deliver(*err);
        return promise;
      },
      [self](cancel_atom, caf::actor& listener) {
        auto& st = self->state;
        for (auto& [id, p] : st.in_flight)
          if (p.listener == listener) {
            if (auto out = st.engine->cancel(id))
              deliver(self, *out);  // answered as aborted
            return;
          }
      },
      [self](cancel_atom) {
        auto& st = self->state;
        std::vector<uint64_t> ids;
        for (auto& [id, p] : st.in_flight)
          if (p.to_pool)
            ids.push_back(id);
        for (auto id : ids) {
          if (auto out = st.engine->cancel(id)) {
            deliver(self, *out);                                                   // answered as aborted
          } else if (auto it = st.in_flight.find(id); it != st.in_flight.end()) {  // still queued, or generated
            fail(it->second, caf::make_error(caf::sec::runtime_error, "rollout " + st.setup.name + ": cancelled"));
            st.in_flight.erase(it);
          }
        }
        for (auto& o : st.at_pool)  // generated, with a pool: nothing of them is saved or sent on
          o->to.promise.deliver(caf::make_error(caf::sec::runtime_error, "cancelled"));
        st.at_pool.clear();
        for (auto& o : st.refused)
          o.to.promise.deliver(caf::make_error(caf::sec::runtime_error, "cancelled"));
        st.refused.clear();
        spdlog::info("rollout {}: {} request(s) cancelled by the controller", st.setup.name, ids.size());
      },
      [self](snapshot_atom) { return snapshot(self->state); },
      [self](weights_atom) { return self->state.engine->next_version(); },
      [self](caf::tick_atom) {
        // Every sample a full pool refused is offered again; a refusal puts it back.
        auto& st = self->state;
        st.retry_armed = false;
        auto waiting = std::exchange(st.refused, {});
        for (auto& o : waiting)
          send_to_pool(self, std::move(o));
      },
      [self](local_weights& w) {
        if (w.flat)
          self->state.engine->update_weights(w.version, *w.flat);
      },
      [self](step_atom) {
        auto& st = self->state;
        st.stepping = false;
        {
          compute_share::step step{st.setup.share.get(), st.setup.compute_threads};
          kernels::set_compute_threads(step.threads());  // per thread in ATen; this is the worker's own
          try {
            traced_step(self);
          } catch (const std::exception& e) {
            spdlog::error("rollout {}: engine step failed: {}; aborting its requests", st.setup.name, e.what());
            for (auto& out : st.engine->abort_all())
              deliver(self, out);
          }
        }
        keep_stepping(self);
      },
  };
}

}  // namespace

rollout_actor spawn_rollout(caf::actor_system& sys, rollout_setup setup) {
  return sys.spawn<caf::detached>(rollout_behavior, std::move(setup));
}

}  // namespace areal
