// The simulated members (sim_members.hpp). Times are integer nanoseconds of
// virtual time, so that a run is exactly repeatable.
#include "sim_members.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <queue>
#include <set>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "areal/messages/packed.hpp"

namespace areal::sim {

int64_t sim_world::now_ns(const caf::actor_clock& clock) const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock.now() - start).count();
}

void sim_world::record(int64_t ns, const std::string& line) {
  auto text = fmt::format("{}.{:09d} {}\n", ns / 1000000000, ns % 1000000000, line);
  for (unsigned char c : text)
    hash = (hash ^ c) * 1099511628211ULL;
  if (setup.keep_log)
    log += text;
}

namespace {

// Wall time spent in the simulated members' handlers (sim_world::member_wall_ns),
// so that the controller's own share of a simulation's time can be told apart.
struct timed_handler {
  explicit timed_handler(sim_world& w) : world(w), start(std::chrono::steady_clock::now()) {}
  ~timed_handler() {
    world.member_wall_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  }
  sim_world& world;
  std::chrono::steady_clock::time_point start;
};

int64_t to_ns(double seconds) {
  return std::max<int64_t>(0, std::llround(seconds * 1e9));
}

std::string versions_text(const std::vector<int64_t>& runs) {
  std::string out;
  for (size_t i = 0; i + 1 < runs.size(); i += 2)
    out += fmt::format("{}{}x{}", out.empty() ? "" : ",", runs[i], runs[i + 1]);
  return out;
}

// ---------------------------------------------------------------- engine

struct sim_sequence {
  uint64_t group = 0;
  uint32_t index = 0;
  int64_t prompt = 0, target = 0, generated = 0;
  bool cached = false;            // its KV cache holds its context (false: a prefill is due)
  std::vector<int64_t> runs;      // (version, tokens) of its output so far
  caf::response_promise promise;  // the controller's request
  caf::actor pool, store;
};

struct engine_state {
  static inline const char* name = "areal.sim.engine";
  sim_world* world = nullptr;
  std::string label;
  std::vector<sim_sequence> active;
  std::deque<sim_sequence> waiting;
  int64_t version = 0, newest = 0;
  // The segment in flight: a prefill, then `steps` decode steps of `batch` sequences
  // starting from `context` tokens; its tick (id) comes at `end`.
  bool running = false;
  bool computing = false;  // counted in sim_world::engines_computing
  bool shared = false;     // the segment runs while the trainer computes on the same cores
  double slowdown = 1;     // the segment's steps take this many times their time alone (shared_cores)
  uint64_t id = 0;
  int64_t start = 0, prefill_end = 0, end = 0, steps = 0, batch = 0;
  double context = 0;
  std::set<uint64_t> prompts;  // groups whose prompt the cache holds (shared_prompts), under the current weights
  // Sequences here (active) per group, and the groups that have had none since the prompts were last pruned:
  // kept as sequences come and go, since rebuilding them every step boundary took half of a 512-device run.
  std::unordered_map<uint64_t, int64_t> here;
  std::vector<uint64_t> emptied;
};

using engine_pointer = caf::stateful_actor<engine_state>*;

// The costs of the engine's segment: on cores of its own, or shared with the trainer computing now.
const cost_model& segment_costs(const engine_state& st) {
  auto& costs = *st.world->setup.costs;
  return st.shared ? *costs.when_sharing() : costs;
}

int64_t step_ns(const engine_state& st, int64_t batch, double context) {
  return std::max<int64_t>(1, to_ns(segment_costs(st).decode_step_seconds(batch, context) * st.slowdown));
}

// On shared cores the others' speed depends on whether this engine computes:
// tell them when that changes (the trainer; with shared_cores the other engines too).
void set_computing(engine_state& st, const caf::actor& self, bool computing) {
  if (st.computing == computing)
    return;
  st.computing = computing;
  auto& w = *st.world;
  w.engines_computing += computing ? 1 : -1;
  if (!w.contended())
    return;
  caf::anon_send(w.store, sim_load_atom::value);
  if (w.setup.shared_cores > 0)
    for (auto& e : w.engines)
      if (e != self)
        caf::anon_send(e, sim_load_atom::value);
}

double context_of(const std::vector<sim_sequence>& seqs) {
  double sum = 0;
  for (auto& s : seqs)
    sum += double(s.prompt + s.generated);
  return sum;
}

void finish_sequence(engine_pointer self, sim_sequence& s, int64_t now) {
  auto& st = self->state;
  sample_summary summary;
  summary.group_id = s.group;
  summary.sample_index = s.index;
  summary.output_tokens = s.generated;
  summary.version_runs = std::move(s.runs);
  summary.finish = static_cast<uint8_t>(s.generated >= st.world->setup.work.max_new_tokens ? finish_reason::length
                                                                                           : finish_reason::stop);
  summary.judged = static_cast<uint8_t>((s.group + s.index) % 2 == 0 ? verdict::correct : verdict::wrong);
  summary.reward = summary.judged == static_cast<uint8_t>(verdict::correct) ? 1.0f : 0.0f;
  summary.producer = st.label;
  st.world->record(now, fmt::format("done {}.{} {} tokens={} versions={}", s.group, s.index, st.label, s.generated,
                                    versions_text(summary.version_runs)));
  s.promise.delegate(s.pool, sim_score_atom::value, std::move(summary), s.store);
}

// Between two steps: finished sequences leave, new weights are taken, waiting
// sequences join, and the next segment is planned up to the next completion.
void plan(engine_pointer self, int64_t now) {
  auto& st = self->state;
  auto& w = *st.world;
  auto& costs = *w.setup.costs;
  for (auto& s : st.active)
    if (s.generated >= s.target) {
      finish_sequence(self, s, now);
      if (auto it = st.here.find(s.group); it != st.here.end() && --it->second == 0) {
        st.here.erase(it);
        st.emptied.push_back(s.group);
      }
    }
  st.active.erase(
      std::remove_if(st.active.begin(), st.active.end(), [](const sim_sequence& s) { return s.generated >= s.target; }),
      st.active.end());
  bool waiting_mode = w.setup.on_weights == interruption::wait;
  if (st.newest > st.version && (!waiting_mode || st.active.empty())) {
    int64_t interrupted = 0;
    for (auto& s : st.active) {
      interrupted += s.generated > 0 ? 1 : 0;
      s.cached = false;
    }
    w.interruptions += interrupted;
    st.prompts.clear();
    st.version = st.newest;
    w.record(now, fmt::format("weights {} version={} interrupted={}", st.label, st.version, interrupted));
  }
  bool draining = waiting_mode && st.newest > st.version;
  auto slots = static_cast<size_t>(w.slots);
  while (!draining && !st.waiting.empty() && st.active.size() < slots) {
    st.here[st.waiting.front().group]++;
    st.active.push_back(std::move(st.waiting.front()));
    st.waiting.pop_front();
  }
  st.running = !st.active.empty();
  set_computing(st, caf::actor_cast<caf::actor>(self), st.running);
  if (!st.running)
    return;
  st.shared = costs.when_sharing() && (w.training || (w.setup.shared_cores > 0 && w.engines_computing > 1));
  st.slowdown = w.slowdown();
  auto& now_costs = segment_costs(st);
  double fresh_tokens = 0, fresh_attended = 0, again_tokens = 0, again_attended = 0;
  int64_t steps = INT64_MAX;
  // A prompt stays cached while a sequence of its group is here.
  for (auto group : st.emptied)
    if (!st.here.count(group))
      st.prompts.erase(group);
  st.emptied.clear();
  for (auto& s : st.active) {
    steps = std::min(steps, s.target - s.generated);
    if (s.cached)
      continue;
    auto& tokens = s.generated > 0 ? again_tokens : fresh_tokens;
    auto& attended = s.generated > 0 ? again_attended : fresh_attended;
    double p = double(s.prompt), g = double(s.generated);
    if (!w.setup.shared_prompts || st.prompts.insert(s.group).second) {  // the group's prompt: computed once
      tokens += p;
      attended += 0.5 * p * (p + 1);
    }
    tokens += g;  // the sequence's own tokens attend over the prompt and each other
    attended += g * p + 0.5 * g * (g + 1);
    s.cached = true;
  }
  auto prefill_ns = [&](double tokens, double attended) {
    return tokens > 0 ? to_ns(now_costs.prefill_seconds(tokens, attended) * st.slowdown) : 0;
  };
  int64_t again = prefill_ns(again_tokens, again_attended);
  int64_t prefill = again + prefill_ns(fresh_tokens, fresh_attended);
  w.reprefill_ns += again;
  w.prefill_tokens += std::llround(fresh_tokens + again_tokens);
  st.batch = static_cast<int64_t>(st.active.size());
  st.context = context_of(st.active);
  st.start = now;
  st.prefill_end = now + prefill;
  st.end = st.prefill_end;
  for (int64_t i = 0; i < steps; ++i)
    st.end += step_ns(st, st.batch, st.context + double(i * st.batch));
  st.steps = steps;
  self->delayed_send(self, std::chrono::nanoseconds(st.end - now), step_atom::value, ++st.id);
}

// The segment's tick: its sequences advanced by its steps.
void segment_done(engine_pointer self, uint64_t id) {
  auto& st = self->state;
  if (!st.running || id != st.id)
    return;  // a segment cut short: its tick came after the new one's
  auto now = st.world->now_ns(self->clock());
  for (auto& s : st.active) {
    s.generated += st.steps;
    if (st.steps > 0) {
      if (s.runs.size() >= 2 && s.runs[s.runs.size() - 2] == st.version)
        s.runs.back() += st.steps;
      else
        s.runs.insert(s.runs.end(), {st.version, st.steps});
    }
  }
  st.world->generated_tokens += st.steps * st.batch;
  st.world->engine_busy_ns += st.end - st.start;
  st.running = false;
  plan(self, now);
}

// Something for the next step boundary arrived (work, or weights to take now):
// the segment ends at the first boundary from now on.
void cut_segment(engine_pointer self, int64_t now) {
  auto& st = self->state;
  if (!st.running) {
    plan(self, now);
    return;
  }
  int64_t t = st.prefill_end, j = 0;
  while (t < now && j < st.steps)
    t += step_ns(st, st.batch, st.context + double(j++ * st.batch));
  if (j >= st.steps)
    return;  // the segment's own end is the next boundary
  st.steps = j;
  st.end = t;
  self->delayed_send(self, std::chrono::nanoseconds(t - now), step_atom::value, ++st.id);
}

caf::behavior engine_behavior(engine_pointer self, sim_world* world, std::string label) {
  self->state.world = world;
  self->state.label = std::move(label);
  return {
      [self](packed<generation_request>& packed_request, packed<reward_task>&, caf::actor& pool, caf::actor& store) {
        timed_handler timed{*self->state.world};
        auto& st = self->state;
        auto& w = *st.world;
        auto now = w.now_ns(self->clock());
        auto request = unpack(packed_request);
        sim_sequence s;
        if (request) {
          s.group = request->group_id;
          s.index = request->sample_index;
          s.prompt = static_cast<int64_t>(request->prompt_tokens.size());
          s.target = w.setup.work.response_tokens(s.group, s.index);
        }
        s.promise = self->make_response_promise();
        if (!request) {
          s.promise.deliver(request.error());
          return;
        }
        s.pool = pool;
        s.store = store;
        w.record(now, fmt::format("dispatch {}.{} {} admitted_version={}", s.group, s.index, st.label,
                                  request->admitted_version));
        st.waiting.push_back(std::move(s));
        bool draining = w.setup.on_weights == interruption::wait && st.newest > st.version;
        if (!draining && st.active.size() < static_cast<size_t>(w.slots))
          cut_segment(self, now);
      },
      [self](weights_atom, int64_t version) {
        timed_handler timed{*self->state.world};
        auto& st = self->state;
        if (version <= st.newest)
          return;
        st.newest = version;
        if (st.world->setup.on_weights == interruption::reprefill || !st.running)
          cut_segment(self, st.world->now_ns(self->clock()));
      },
      [self](step_atom, uint64_t id) {
        timed_handler timed{*self->state.world};
        segment_done(self, id);
      },
      [self](sim_load_atom) {  // the trainer started or stopped: the next segment runs at the new speed
        timed_handler timed{*self->state.world};
        if (self->state.running)
          cut_segment(self, self->state.world->now_ns(self->clock()));
      },
  };
}

// ---------------------------------------------------------------- scorers

struct scored_item {
  sample_summary summary;
  caf::actor store;
  caf::response_promise promise;
};

struct scorers_state {
  static inline const char* name = "areal.sim.scorers";
  sim_world* world = nullptr;
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> free_at;  // one entry per scorer
  std::map<uint64_t, scored_item> scoring;
  uint64_t next = 0;
};

caf::behavior scorers_behavior(caf::stateful_actor<scorers_state>* self, sim_world* world) {
  self->state.world = world;
  for (int64_t i = 0; i < world->setup.work.reward_workers; ++i)
    self->state.free_at.push(0);
  return {
      [self](sim_score_atom, sample_summary& summary, caf::actor& store) {
        timed_handler timed{*self->state.world};
        auto& st = self->state;
        auto now = st.world->now_ns(self->clock());
        auto start = std::max(now, st.free_at.top());
        st.free_at.pop();
        auto done = start + to_ns(st.world->setup.work.reward_seconds(summary.group_id, summary.sample_index));
        st.free_at.push(done);
        auto key = st.next++;
        st.scoring[key] = {std::move(summary), store, self->make_response_promise()};
        self->delayed_send(self, std::chrono::nanoseconds(done - now), sim_scored_atom::value, key);
      },
      [self](sim_scored_atom, uint64_t key) {
        timed_handler timed{*self->state.world};
        auto& st = self->state;
        auto it = st.scoring.find(key);
        if (it == st.scoring.end())
          return;
        auto item = std::move(it->second);
        st.scoring.erase(it);
        st.world->record(st.world->now_ns(self->clock()),
                         fmt::format("scored {}.{}", item.summary.group_id, item.summary.sample_index));
        item.promise.delegate(item.store, sim_keep_atom::value, std::move(item.summary));
      },
  };
}

// ---------------------------------------------------------------- store and trainer

struct store_state {
  static inline const char* name = "areal.sim.store";
  sim_world* world = nullptr;
  std::map<uint64_t, sample_summary> slots;
  uint64_t next_slot = 1;
  int64_t version = 0;
  caf::actor controller;  // told when each version's weights reached every engine
  caf::response_promise training;
  train_report report;
  int64_t train_start = 0;
  // The step in flight as work done at a speed that changes with the engines
  // computing beside it (shared cores): the share of it left, when that was
  // counted, its length alone and shared, and the tick that ends it.
  double work_left = 0;
  int64_t counted_at = 0;
  double counted_s = 0;  // the whole step's length at the speed it has had since counted_at
  double alone_s = 0, shared_s = 0;
  uint64_t tick = 0;
};

// The training step's end from now at the speed the engines computing now allow.
void schedule_step_end(caf::stateful_actor<store_state>* self, int64_t now) {
  auto& st = self->state;
  auto& w = *st.world;
  st.counted_s = (w.engines_computing > 0 ? st.shared_s : st.alone_s) * w.slowdown();
  st.counted_at = now;
  self->delayed_send(self, std::chrono::nanoseconds(to_ns(st.work_left * st.counted_s)), sim_trained_atom::value,
                     ++st.tick);
}

// The engines run at a new speed now that training started or stopped.
void tell_engines(store_state& st) {
  if (st.world->contended())
    for (auto& e : st.world->engines)
      caf::anon_send(e, sim_load_atom::value);
}

caf::behavior store_behavior(caf::stateful_actor<store_state>* self, sim_world* world) {
  self->state.world = world;
  return {
      [self](sim_keep_atom, sample_summary& summary) {
        timed_handler timed{*self->state.world};
        auto& st = self->state;
        summary.slot = st.next_slot++;
        st.slots[summary.slot] = summary;
        return summary;
      },
      [self](forget_atom, std::vector<uint64_t>& slots) {
        timed_handler timed{*self->state.world};
        for (auto s : slots)
          self->state.world->dropped_samples += static_cast<int64_t>(self->state.slots.erase(s));
      },
      [self](train_atom, std::vector<uint64_t>& slots) {
        timed_handler timed{*self->state.world};
        auto& st = self->state;
        auto& w = *st.world;
        auto now = w.now_ns(self->clock());
        st.controller = caf::actor_cast<caf::actor>(self->current_sender());
        std::vector<int64_t> lengths;
        train_report r;
        r.version = st.version + 1;
        int64_t oldest = st.version;
        for (auto slot : slots) {
          auto it = st.slots.find(slot);
          if (it == st.slots.end())
            continue;
          auto n = w.setup.work.prompt_tokens + it->second.output_tokens;
          lengths.push_back(n);
          r.tokens += n;
          r.samples++;
          oldest = std::min(oldest, oldest_version(it->second, st.version));
          st.slots.erase(it);
        }
        r.max_staleness = st.version - oldest;
        auto& costs = *w.setup.costs;
        st.alone_s = costs.train_seconds(lengths, w.setup.trainer_devices());
        st.shared_s =
            costs.when_sharing() ? costs.when_sharing()->train_seconds(lengths, w.setup.trainer_devices()) : st.alone_s;
        st.work_left = 1;
        st.report = r;
        st.train_start = now;
        st.training = self->make_response_promise();
        w.training = true;
        tell_engines(st);
        w.record(now, fmt::format("train version={} samples={} tokens={}", r.version, r.samples, r.tokens));
        schedule_step_end(self, now);
      },
      [self](sim_load_atom) {  // an engine started or stopped computing beside the step in flight
        timed_handler timed{*self->state.world};
        auto& st = self->state;
        if (!st.world->training)
          return;
        auto now = st.world->now_ns(self->clock());
        // The work done since it was last counted, at the speed it had.
        st.work_left = std::max(0.0, st.work_left - double(now - st.counted_at) * 1e-9 / st.counted_s);
        schedule_step_end(self, now);
      },
      [self](sim_trained_atom, uint64_t tick) {
        timed_handler timed{*self->state.world};
        auto& st = self->state;
        auto& w = *st.world;
        if (tick != st.tick || !w.training)
          return;  // the step's end moved: a later tick ends it
        auto now = w.now_ns(self->clock());
        w.training = false;
        tell_engines(st);
        st.report.seconds = double(now - st.train_start) * 1e-9;
        w.trainer_busy_ns += now - st.train_start;
        st.version = st.report.version;
        w.trained.push_back(
            {st.version, double(now) * 1e-9, st.report.samples, st.report.tokens, st.report.max_staleness});
        w.record(now, fmt::format("version {}", st.version));
        st.training.deliver(st.report);
        // The weights go to each node of engines in turn (colocated: already in place).
        auto per_node = std::max<int64_t>(1, w.setup.costs->devices_per_node() / w.setup.costs->devices_per_engine());
        auto transfer = w.setup.colocated ? 0 : to_ns(w.setup.costs->transfer_seconds());
        int64_t last = 0;  // when the last node has them
        for (size_t e = 0; e < w.engines.size(); ++e) {
          auto node = static_cast<int64_t>(e) / per_node;
          last = std::max(last, (node + 1) * transfer);
          self->delayed_send(w.engines[e], std::chrono::nanoseconds((node + 1) * transfer), weights_atom::value,
                             st.version);
        }
        // As the job's publisher does: the controller learns when the last node has them (it admits from then).
        if (!w.setup.colocated && st.controller) {
          weight_delivery d;
          d.subscriber = "engines";
          d.version = st.version;
          d.backend = "simulated";
          d.seconds = double(last) * 1e-9;
          self->delayed_send(st.controller, std::chrono::nanoseconds(last), std::vector<weight_delivery>{d});
        }
      },
  };
}

}  // namespace

caf::actor spawn_engine(caf::actor_system& sys, sim_world& world, std::string name) {
  return sys.spawn(engine_behavior, &world, std::move(name));
}

caf::actor spawn_scorers(caf::actor_system& sys, sim_world& world) {
  return sys.spawn(scorers_behavior, &world);
}

caf::actor spawn_store(caf::actor_system& sys, sim_world& world) {
  return sys.spawn(store_behavior, &world);
}

caf::actor spawn_listener(caf::actor_system& sys, sim_world& world) {
  return sys.spawn([w = &world](caf::event_based_actor*) -> caf::behavior {
    return {[w](done_atom, int32_t code, std::string& why) {
      w->done = true;
      w->exit_code = code;
      w->end_reason = why;
    }};
  });
}

}  // namespace areal::sim
