// Model calls through relay actors (see endpoint_calls.hpp).
#include "endpoint_calls.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include <caf/all.hpp>

namespace areal::endpoint_detail {

namespace {

// What the relays tell the waiting HTTP thread.
struct channel {
  struct event {
    size_t choice = 0;
    std::vector<int32_t> delta;
    std::optional<trajectory> done;
    std::string error;
  };
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<event> events;

  void push(event e) {
    {
      std::lock_guard<std::mutex> lock{mutex};
      events.push_back(std::move(e));
    }
    ready.notify_one();
  }
  std::optional<event> pop(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock{mutex};
    if (!ready.wait_until(lock, deadline, [&] { return !events.empty(); }))
      return std::nullopt;
    auto e = std::move(events.front());
    events.pop_front();
    return e;
  }
};

// One choice's generation: asks the worker, passes on what comes back, quits.
caf::actor spawn_relay(caf::actor_system& sys, std::shared_ptr<channel> ch, size_t index, rollout_actor worker,
                       packed<generation_request> request, std::chrono::milliseconds timeout) {
  return sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->request(worker, timeout, stream_atom::value, request, caf::actor{self})
        .then(
            [=](packed<trajectory>& t, std::string&) {
              auto decoded = unpack(t);
              channel::event e;
              e.choice = index;
              if (decoded)
                e.done = std::move(*decoded);
              else
                e.error = "the worker's reply could not be read: " + to_string(decoded.error());
              ch->push(std::move(e));
              self->quit();
            },
            [=](caf::error& err) {
              channel::event e;
              e.choice = index;
              e.error = to_string(err);
              ch->push(std::move(e));
              self->quit();
            });
    return {
        [=](stream_atom, std::vector<int32_t>& tokens) {
          channel::event e;
          e.choice = index;
          e.delta = std::move(tokens);
          ch->push(std::move(e));
        },
    };
  });
}

}  // namespace

std::vector<openai::choice> run_call(caf::actor_system& sys, const std::vector<rollout_actor>& workers,
                                     size_t first_worker, const call_plan& plan,
                                     std::chrono::milliseconds timeout, const delta_sink& on_delta) {
  if (workers.empty())
    throw call_failed{503, "this node has no rollout worker to generate with"};
  auto ch = std::make_shared<channel>();
  auto n = static_cast<size_t>(plan.ask.n);
  std::vector<caf::actor> relays;
  std::vector<rollout_actor> used;
  for (size_t i = 0; i < n; ++i) {
    generation_request r;
    r.prompt_tokens = plan.prompt;
    r.sampling.greedy = plan.ask.temperature == 0;
    r.sampling.temperature = plan.ask.temperature == 0 ? 1.0f : static_cast<float>(plan.ask.temperature);
    r.sampling.top_p = static_cast<float>(plan.ask.top_p);
    r.sampling.top_k = static_cast<uint32_t>(plan.ask.top_k);
    r.sampling.max_new_tokens = plan.max_new_tokens;
    r.sampling.stop_tokens = plan.stop_tokens;
    r.seed = plan.seed + i;
    r.admitted_version = plan.admitted_version;
    auto packed_request = pack(r);
    if (!packed_request)
      throw call_failed{400, to_string(packed_request.error())};
    auto& worker = workers[(first_worker + i) % workers.size()];
    used.push_back(worker);
    relays.push_back(spawn_relay(sys, ch, i, worker, std::move(*packed_request), timeout));
  }
  auto cancel_all = [&] {
    for (size_t i = 0; i < relays.size(); ++i)
      caf::anon_send(used[i], cancel_atom::value, relays[i]);
  };
  std::vector<std::optional<trajectory>> done(n);
  size_t finished = 0;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string failure;
  while (finished < n) {
    auto e = ch->pop(deadline);
    if (!e) {
      cancel_all();
      throw call_failed{503, "the call did not finish within " + std::to_string(timeout.count() / 1000.0) +
                                 " s (endpoint.request_timeout_s); its generation was stopped"};
    }
    if (!e->error.empty() || e->done) {
      ++finished;
      if (e->done)
        done[e->choice] = std::move(e->done);
      else if (failure.empty())
        failure = e->error;
      continue;
    }
    if (on_delta && !on_delta(e->choice, e->delta)) {
      cancel_all();
      throw call_failed{499, "the client went away"};
    }
  }
  if (!failure.empty())
    throw call_failed{503, "generation failed: " + failure};
  std::vector<openai::choice> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].tokens = done[i]->output_tokens;
    out[i].logprobs = done[i]->behaviour_logprobs;
    out[i].versions = done[i]->token_versions;
    out[i].finish = done[i]->finish;
  }
  return out;
}

}  // namespace areal::endpoint_detail
