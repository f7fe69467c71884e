// The rollout worker's behaviour: requests are queued into the engine, and the
// worker steps the engine by sending itself `step` messages; whatever arrives
// meanwhile (requests, weights) is handled between two steps.
#include <ATen/Parallel.h>

#include <chrono>
#include <map>

#include <caf/all.hpp>

#include "areal/actors/rollout.hpp"
#include "areal/runtime/log.hpp"

namespace areal {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct pending {
  caf::typed_response_promise<packed<trajectory>, std::string> promise;
  generation_request request;
  int64_t started_ns;
};

struct rollout_state {
  static inline const char* name = "areal.rollout";
  rollout_setup setup;
  std::unique_ptr<kernels::generation_engine> engine;
  std::map<uint64_t, pending> in_flight;  // by engine job id
  uint64_t next_job = 0;
  bool stepping = false;
  bool busy = false;  // counted as busy in the compute share
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

void traced_step(rollout_pointer self) {
  auto& st = self->state;
  auto applied_before = st.engine->counters().weight_apply_seconds;
  auto start = trace_clock_ns();
  auto outputs = st.engine->step();
  auto end = trace_clock_ns();
  if (st.setup.trace) {
    auto apply_ns = static_cast<int64_t>((st.engine->counters().weight_apply_seconds - applied_before) * 1e9);
    if (apply_ns > 0)
      st.setup.trace->span(st.setup.name, "weight sync", start, start + apply_ns);
    st.setup.trace->span(st.setup.name, "generate", start + apply_ns, end);
  }
  for (auto& out : outputs)
    deliver(self, out);
}

void deliver(rollout_pointer self, kernels::generation_output& out) {
  auto& st = self->state;
  auto it = st.in_flight.find(out.id);
  if (it == st.in_flight.end())
    return;
  auto& p = it->second;
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
  t.timestamps.generation_end_ns = now_ns();
  if (out.finish == finish_reason::aborted) {
    // Never scored or trained: the controller generates it again.
    p.promise.deliver(caf::make_error(caf::sec::runtime_error,
                                      "rollout " + st.setup.name + ": the sequence was aborted by its engine"));
    st.in_flight.erase(it);
    return;
  }
  std::string text = st.setup.tokenizer ? st.setup.tokenizer->decode(out.tokens, true) : std::string{};
  auto packed_t = pack(t);
  if (packed_t)
    p.promise.deliver(std::move(*packed_t), std::move(text));
  else
    p.promise.deliver(packed_t.error());
  st.in_flight.erase(it);
}

rollout_actor::behavior_type rollout_behavior(rollout_pointer self, rollout_setup setup) {
  self->state.setup = std::move(setup);
  auto& s = self->state.setup;
  self->state.engine = std::make_unique<kernels::generation_engine>(*s.model, s.engine, s.initial_version);
  return {
      [self](packed<generation_request>& msg) -> caf::result<packed<trajectory>, std::string> {
        auto& st = self->state;
        auto request = unpack(msg);
        if (!request)
          return std::move(request.error());
        kernels::generation_job job;
        job.id = st.next_job++;
        job.prompt = request->prompt_tokens;
        job.sampling = request->sampling;
        job.seed = request->seed;
        try {
          st.engine->submit(job);
        } catch (const std::invalid_argument& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string{"rollout "} + st.setup.name + ": " + e.what());
        }
        auto promise = self->make_response_promise<packed<trajectory>, std::string>();
        st.in_flight.emplace(job.id, pending{promise, std::move(*request), now_ns()});
        keep_stepping(self);
        return promise;
      },
      [self](local_weights& w) {
        if (w.flat)
          self->state.engine->update_weights(w.version, *w.flat);
      },
      [self](step_atom) {
        auto& st = self->state;
        st.stepping = false;
        // Per thread in ATen; this is the worker's own.
        at::set_num_threads(st.setup.share ? st.setup.share->threads_now() : st.setup.compute_threads);
        try {
          traced_step(self);
        } catch (const std::exception& e) {
          spdlog::error("rollout {}: engine step failed: {}; aborting its requests", st.setup.name, e.what());
          for (auto& out : st.engine->abort_all())
            deliver(self, out);
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
