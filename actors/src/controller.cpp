// The controller's behaviour. Event driven: every reply (a trajectory, a
// verdict, a training report) may free capacity, complete a group or a batch,
// and each handler ends by trying to train and to admit more work.
#include "areal/actors/controller.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "areal/actors/admission.hpp"
#include "areal/runtime/log.hpp"

namespace areal {

// -- checkpoint record --------------------------------------------------------

std::string controller_checkpoint::to_json() const {
  nlohmann::json j = {{"format", 1},
                      {"version", version},
                      {"steps", steps},
                      {"admitted", admitted},
                      {"trained", trained},
                      {"dropped", dropped},
                      {"drop_reasons", drop_reasons},
                      {"max_staleness", max_staleness},
                      {"reward_mean_first", reward_mean_first},
                      {"reward_mean_last", reward_mean_last},
                      {"source_position", source_position},
                      {"requeue", requeue},
                      {"dropped_positions", dropped_positions},
                      {"next_group", next_group},
                      {"generated_tokens", generated_tokens},
                      {"trained_tokens", trained_tokens},
                      {"elapsed_s", elapsed_s}};
  return j.dump(2) + "\n";
}

controller_checkpoint controller_checkpoint::from_json(const std::string& text, const std::string& where) {
  try {
    auto j = nlohmann::json::parse(text);
    if (j.value("format", 0) != 1)
      throw std::invalid_argument(where + ": not a controller checkpoint of format 1");
    controller_checkpoint c;
    c.version = j.at("version").get<int64_t>();
    c.steps = j.at("steps").get<int64_t>();
    c.admitted = j.at("admitted").get<int64_t>();
    c.trained = j.at("trained").get<int64_t>();
    c.dropped = j.at("dropped").get<int64_t>();
    c.drop_reasons = j.at("drop_reasons").get<std::map<std::string, int64_t>>();
    c.max_staleness = j.at("max_staleness").get<int64_t>();
    c.reward_mean_first = j.at("reward_mean_first").get<double>();
    c.reward_mean_last = j.at("reward_mean_last").get<double>();
    c.source_position = j.at("source_position").get<uint64_t>();
    c.requeue = j.at("requeue").get<std::vector<uint64_t>>();
    c.dropped_positions = j.at("dropped_positions").get<std::vector<uint64_t>>();
    c.next_group = j.at("next_group").get<uint64_t>();
    c.generated_tokens = j.at("generated_tokens").get<int64_t>();
    c.trained_tokens = j.at("trained_tokens").get<int64_t>();
    c.elapsed_s = j.at("elapsed_s").get<double>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(where + ": " + e.what());
  }
}

controller_checkpoint controller_checkpoint::load(const std::string& checkpoint_directory) {
  auto path = checkpoint_directory + "/" + file_name;
  std::ifstream in(path);
  if (!in)
    throw std::invalid_argument(path + ": cannot read the controller's checkpoint");
  std::stringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path);
}

namespace {

struct queued_sample {
  generation_request request;
  std::shared_ptr<const reward_task> task;
  bool admitted = false;  // generated again after a failure: admitted and counted once already
  int attempts = 0;       // requests that failed for it so far
};

// A rollout worker or reward pool taking part in the run (local or on another node).
struct member {
  caf::actor handle;
  std::string node;  // empty: this process
  int64_t load = 0;  // its requests in flight
};

// A generated sample on its way to the reward pool (kept while the pool's queue is full).
struct reward_job {
  packed<trajectory> t;
  std::string text;
  std::shared_ptr<const reward_task> task;
  uint64_t group;
};

// What the metrics line of a step says about its batch, taken when it is formed.
struct batch_facts {
  nlohmann::json fields;
  int64_t tokens = 0;
};

struct controller_state {
  static inline const char* name = "areal.controller";
  controller_setup setup;
  std::unique_ptr<staleness_gate> gate;
  std::unique_ptr<group_buffer> buffer;
  std::deque<queued_sample> pending;         // samples of started groups, not yet admitted
  std::deque<uint64_t> requeue;              // stream positions to generate again first (after a resume)
  std::map<uint64_t, uint64_t> open_groups;  // group id -> stream position, until trained or dropped
  std::vector<uint64_t> dropped_positions;   // stream positions of the groups dropped
  std::map<uint64_t, member> rollouts;       // by member id
  std::map<uint64_t, member> rewards;        // by member id
  uint64_t next_member = 0;
  std::map<uint64_t, std::pair<uint64_t, queued_sample>> generating;  // request id -> (rollout, sample)
  std::map<uint64_t, std::pair<uint64_t, reward_job>> scoring;        // request id -> (reward pool, job)
  uint64_t next_request = 0;
  std::deque<reward_job> reward_backlog;  // waiting for a reward pool (full queues, or none joined)
  bool member_deadline_armed = false;
  double window_transfer_s = 0;  // slowest remote weight transfer reported since the last step line
  int64_t window_transfer_errors = 0;
  int64_t failures_in_row = 0;  // samples dropped since the last one that was scored
  controller_stats stats;
  std::map<std::string, int64_t> carried_drops;  // from before a resume, and the run's end
  bool training = false;
  bool evaluating = false;
  bool checkpointing = false;
  bool stopping = false;  // no more admissions
  bool ending = false;    // the final checkpoint is being written
  bool finished = false;
  int32_t end_code = 0;
  std::string end_why;
  uint64_t next_group = 0;
  int64_t generated_tokens = 0, trained_tokens = 0;
  double elapsed_before = 0;  // seconds of the run before a resume
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  // The metrics window: since the previous step's line.
  std::chrono::steady_clock::time_point window_start = started;
  int64_t window_generated = 0;
  std::map<std::string, double> window_busy;
  double window_weight_sync = 0;
  std::ofstream metrics;
};

using controller_pointer = controller_actor::stateful_pointer<controller_state>;

void fill(controller_pointer self);
void try_train(controller_pointer self);

double run_seconds(controller_state& st) {
  return st.elapsed_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - st.started).count();
}

void write_metrics(controller_state& st, const nlohmann::json& line) {
  if (st.metrics.is_open()) {
    st.metrics << line.dump() << "\n";
    st.metrics.flush();
  }
}

std::map<std::string, int64_t> all_drops(controller_state& st) {
  auto out = st.carried_drops;
  for (auto& [reason, n] : st.buffer->dropped())
    out[reason] += n;
  return out;
}

// Closes the groups the buffer dropped: they no longer count as accepted (so
// admission replaces them) and will not be re-queued by a checkpoint.
void settle_drops(controller_pointer self) {
  auto& st = self->state;
  for (auto& closed : st.buffer->take_dropped_groups()) {
    st.gate->discard(closed.delivered);
    auto it = st.open_groups.find(closed.group_id);
    if (it != st.open_groups.end()) {
      st.dropped_positions.push_back(it->second);
      st.open_groups.erase(it);
    }
  }
  int64_t total = 0;
  for (auto& [reason, n] : all_drops(st))
    total += n;
  st.stats.dropped = total;
}

controller_checkpoint checkpoint_record(controller_state& st) {
  controller_checkpoint c;
  c.version = st.gate->version();
  c.steps = st.stats.steps;
  c.trained = st.stats.trained;
  c.drop_reasons = all_drops(st);
  for (auto& [reason, n] : c.drop_reasons)
    c.dropped += n;
  c.admitted = c.trained + c.dropped;
  c.max_staleness = st.stats.max_staleness;
  c.reward_mean_first = st.stats.reward_mean_first;
  c.reward_mean_last = st.stats.reward_mean_last;
  c.source_position = st.setup.source->position();
  c.requeue.assign(st.requeue.begin(), st.requeue.end());
  std::vector<std::pair<uint64_t, uint64_t>> open(st.open_groups.begin(), st.open_groups.end());
  for (auto& [group, position] : open)  // by group id: the order they were started in
    c.requeue.push_back(position);
  c.dropped_positions = st.dropped_positions;
  c.next_group = st.next_group;
  c.generated_tokens = st.generated_tokens;
  c.trained_tokens = st.trained_tokens;
  c.elapsed_s = run_seconds(st);
  return c;
}

void finish(controller_pointer self, int32_t code, const std::string& why) {
  auto& st = self->state;
  if (st.finished)
    return;
  st.finished = true;
  // Whatever was admitted and will not be trained is dropped, with this reason.
  auto unfinished = st.stats.admitted - st.stats.trained - st.stats.dropped;
  if (unfinished > 0) {
    st.carried_drops[st.setup.checkpoint_dir.empty()
                         ? "run ended before it was trained"
                         : "run ended before it was trained (re-queued in the checkpoint)"] += unfinished;
    st.stats.dropped += unfinished;
  }
  st.stats.running = 0;
  st.stats.buffered = 0;
  nlohmann::json line = {{"event", "end"},
                         {"time_s", run_seconds(st)},
                         {"why", why},
                         {"steps", st.stats.steps},
                         {"admitted", st.stats.admitted},
                         {"trained", st.stats.trained},
                         {"dropped", st.stats.dropped},
                         {"drop_reasons", all_drops(st)}};
  write_metrics(st, line);
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
  auto record = checkpoint_record(st);
  self->request(st.setup.trainer, caf::infinite, checkpoint_atom::value, st.setup.checkpoint_dir, record.to_json())
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

// Ends the run once no training step is in flight: final checkpoint, then done.
void end_run(controller_pointer self, int32_t code, const std::string& why) {
  auto& st = self->state;
  st.stopping = true;
  if (st.finished || st.ending)
    return;
  st.end_code = code;
  st.end_why = why;
  if (st.training || st.checkpointing)
    return;  // the step's reply (or the checkpoint's) ends the run
  st.ending = true;
  save_checkpoint(self, [self](bool ok) {
    auto& s = self->state;
    finish(self, ok ? s.end_code : 1, ok ? s.end_why : s.end_why + "; the final checkpoint failed");
  });
}

void drop(controller_pointer self, uint64_t group, const std::string& reason) {
  auto& st = self->state;
  st.gate->finish(false);
  st.buffer->drop_sample(group, reason);
  settle_drops(self);
  // A run whose every sample fails (a request no engine can take, a broken
  // verifier) would admit and drop forever: it stops and says why.
  if (++st.failures_in_row >= std::max<int64_t>(64, 4 * st.setup.batch_size)) {
    st.stopping = true;
    finish(self, 1,
           "the last " + std::to_string(st.failures_in_row) + " samples all failed; the last one: " + reason +
               ". Fix the configuration (e.g. rl.max_new_tokens against the model's context) and start again");
  }
}

void on_scored(controller_pointer self, packed<trajectory>& scored, uint64_t group);

// The member with the fewest requests in flight, or members.end().
std::map<uint64_t, member>::iterator least_loaded(std::map<uint64_t, member>& members) {
  return std::min_element(members.begin(), members.end(),
                          [](auto& x, auto& y) { return x.second.load < y.second.load; });
}

// The work of request `id`, forgotten and its member's load released; nothing
// when the request is already forgotten (its member was lost and the work
// handed to another).
template <class Work>
std::optional<Work> take_request(std::map<uint64_t, std::pair<uint64_t, Work>>& requests,
                                 std::map<uint64_t, member>& members, uint64_t id) {
  auto it = requests.find(id);
  if (it == requests.end())
    return std::nullopt;
  auto work = std::move(it->second.second);
  if (auto m = members.find(it->second.first); m != members.end())
    m->second.load--;
  requests.erase(it);
  return work;
}

void send_to_reward(controller_pointer self, reward_job job);

// Sends waiting samples to the reward pools while some have room.
void drain_reward_backlog(controller_pointer self) {
  auto& st = self->state;
  while (!st.reward_backlog.empty() && !st.rewards.empty() && !st.finished) {
    auto next = std::move(st.reward_backlog.front());
    st.reward_backlog.pop_front();
    send_to_reward(self, std::move(next));
    if (!st.reward_backlog.empty() && st.scoring.size() >= st.rewards.size() * 256)
      return;  // plenty in flight; replies drain the rest
  }
}

// Sends a generated sample to the least loaded reward pool. A full pool queue
// is back-pressure, not a failure: the sample waits and goes again when a
// reply frees a place. With no reward pool it waits for one to join.
void send_to_reward(controller_pointer self, reward_job job) {
  auto& st = self->state;
  auto pool = least_loaded(st.rewards);
  if (pool == st.rewards.end()) {
    st.reward_backlog.push_back(std::move(job));
    return;
  }
  auto pool_id = pool->first;
  pool->second.load++;
  auto id = st.next_request++;
  auto packed_task = *pack(*job.task);
  auto t = job.t;
  auto text = job.text;
  st.scoring.emplace(id, std::make_pair(pool_id, std::move(job)));
  self->request(caf::actor_cast<reward_pool_actor>(pool->second.handle), st.setup.request_timeout, std::move(t),
                std::move(text), std::move(packed_task))
      .then(
          [self, id](packed<trajectory>& scored) {
            auto& cs = self->state;
            auto done = take_request(cs.scoring, cs.rewards, id);
            if (!done || cs.finished)
              return;  // forgotten: its pool was lost and the sample sent elsewhere
            drain_reward_backlog(self);
            on_scored(self, scored, done->group);
          },
          [self, id](caf::error& err) {
            auto& cs = self->state;
            auto refused = take_request(cs.scoring, cs.rewards, id);
            if (!refused || cs.finished)
              return;
            bool queue_full =
                err.category() == caf::atom("reward") && err.code() == static_cast<uint8_t>(reward_errc::queue_full);
            if (queue_full && !cs.scoring.empty()) {
              cs.reward_backlog.push_back(std::move(*refused));
              return;
            }
            drop(self, refused->group, "reward service: " + describe(err));
            fill(self);
          });
}

void on_scored(controller_pointer self, packed<trajectory>& scored, uint64_t group) {
  auto& st = self->state;
  if (st.finished)
    return;
  auto decoded = unpack(scored);
  if (!decoded) {
    drop(self, group, "unreadable scored trajectory: " + describe(decoded.error()));
    fill(self);
    return;
  }
  st.gate->finish(true);
  st.failures_in_row = 0;
  st.generated_tokens += static_cast<int64_t>(decoded->output_tokens.size());
  st.window_generated += static_cast<int64_t>(decoded->output_tokens.size());
  st.buffer->add(std::move(*decoded));
  settle_drops(self);
  try_train(self);
  fill(self);
}

// A sample whose generation failed (a lost node, a deadline) is generated
// again, first in line; after 3 failed attempts it is dropped with the reason.
void generate_again(controller_pointer self, queued_sample sample, const std::string& why) {
  auto& st = self->state;
  if (++sample.attempts >= 3) {
    drop(self, sample.request.group_id, "rollout worker: " + why + " (3 attempts)");
    return;
  }
  sample.admitted = true;
  st.pending.push_front(std::move(sample));
}

void dispatch(controller_pointer self, queued_sample sample) {
  auto& state = self->state;
  auto worker = least_loaded(state.rollouts);
  auto worker_id = worker->first;
  worker->second.load++;
  if (!sample.admitted) {
    state.gate->admit();
    state.stats.admitted++;
    sample.request.admitted_version = state.gate->version();
  }
  auto id = state.next_request++;
  auto request = *pack(sample.request);
  state.generating.emplace(id, std::make_pair(worker_id, std::move(sample)));
  self->request(caf::actor_cast<rollout_actor>(worker->second.handle), state.setup.request_timeout, std::move(request))
      .then(
          [self, id](packed<trajectory>& t, std::string& text) {
            auto& st = self->state;
            auto done = take_request(st.generating, st.rollouts, id);
            if (!done || st.finished)
              return;  // forgotten: its worker was lost and the sample queued again
            send_to_reward(self, {std::move(t), std::move(text), done->task, done->request.group_id});
            fill(self);
          },
          [self, id](caf::error& err) {
            auto& st = self->state;
            auto failed = take_request(st.generating, st.rollouts, id);
            if (!failed || st.finished)
              return;
            generate_again(self, std::move(*failed), describe(err));
            fill(self);
          });
}

// Expands the next prompt (re-queued ones first) into a group of pending samples.
bool start_group(controller_pointer self) {
  auto& st = self->state;
  std::optional<tasks::task_item> item;
  uint64_t position = 0;
  if (!st.requeue.empty()) {
    auto resume_at = st.setup.source->position();
    position = st.requeue.front();
    st.requeue.pop_front();
    st.setup.source->restore(position);
    item = st.setup.source->next();
    st.setup.source->restore(resume_at);
  } else {
    position = st.setup.source->position();
    item = st.setup.source->next();
  }
  if (!item)
    return false;
  auto task = std::make_shared<const reward_task>(item->task);
  auto ids = st.setup.tokenizer->encode(item->prompt);
  auto group = st.next_group++;
  st.open_groups[group] = position;
  for (int64_t k = 0; k < st.setup.group_size; ++k) {
    queued_sample s;
    s.request.prompt_id = item->id;
    s.request.group_id = group;
    s.request.sample_index = static_cast<uint32_t>(k);
    s.request.prompt_tokens = ids;
    s.request.sampling = st.setup.sampling;
    s.request.seed = st.setup.seed * 1000003 + group * 131 + static_cast<uint64_t>(k);
    s.task = task;
    st.pending.push_back(std::move(s));
  }
  return true;
}

// Starts new groups and admits samples while the staleness gate allows.
void fill(controller_pointer self) {
  auto& st = self->state;
  while (!st.finished) {
    auto worker = least_loaded(st.rollouts);
    if (worker == st.rollouts.end() || worker->second.load >= st.setup.rollout_slots)
      return;
    // Samples generated again were admitted already: they go even when the
    // gate is closed or admission has stopped.
    bool again = !st.pending.empty() && st.pending.front().admitted;
    if (!again && (st.stopping || st.gate->capacity() <= 0))
      return;
    if (st.pending.empty() && !start_group(self)) {
      st.stopping = true;  // data exhausted: train what remains
      spdlog::info("controller: the prompt stream is exhausted; training what remains");
      if (st.gate->running() == 0 && !st.training)
        end_run(self, 0, "the prompt stream is exhausted");
      return;
    }
    auto sample = std::move(st.pending.front());
    st.pending.pop_front();
    dispatch(self, std::move(sample));
  }
}

// Per-batch facts for the metrics line: lengths, accuracy, staleness per
// trajectory and per token (in versions behind the policy being trained).
batch_facts describe_batch(const std::vector<trajectory>& batch, int64_t version) {
  batch_facts facts;
  int64_t correct = 0, min_len = INT64_MAX, max_len = 0, tokens = 0, max_traj = 0, max_token = 0;
  double reward = 0, traj_staleness = 0, token_staleness = 0;
  std::vector<int64_t> histogram;
  std::map<std::string, std::pair<int64_t, int64_t>> producers;  // name -> (trajectories, oldest token version)
  for (auto& t : batch) {
    auto n = static_cast<int64_t>(t.output_tokens.size());
    tokens += n;
    min_len = std::min(min_len, n);
    max_len = std::max(max_len, n);
    reward += t.reward;
    correct += t.judged == verdict::correct;
    int64_t oldest = version;
    for (auto v : t.token_versions) {
      auto behind = std::max<int64_t>(0, version - v);
      oldest = std::min(oldest, v);
      token_staleness += static_cast<double>(behind);
      max_token = std::max(max_token, behind);
      if (static_cast<int64_t>(histogram.size()) <= behind)
        histogram.resize(static_cast<size_t>(behind + 1));
      histogram[static_cast<size_t>(behind)]++;
    }
    auto& p = producers.try_emplace(t.producer, 0, version).first->second;
    p.first++;
    p.second = std::min(p.second, oldest);
    traj_staleness += static_cast<double>(version - oldest);
    max_traj = std::max(max_traj, version - oldest);
  }
  auto count = static_cast<double>(std::max<size_t>(1, batch.size()));
  facts.tokens = tokens;
  facts.fields = {{"reward_mean", reward / count},
                  {"accuracy", static_cast<double>(correct) / count},
                  {"response_tokens_mean", static_cast<double>(tokens) / count},
                  {"response_tokens_min", batch.empty() ? 0 : min_len},
                  {"response_tokens_max", max_len},
                  {"staleness_trajectory_mean", traj_staleness / count},
                  {"staleness_trajectory_max", max_traj},
                  {"staleness_token_mean", token_staleness / static_cast<double>(std::max<int64_t>(1, tokens))},
                  {"staleness_token_max", max_token},
                  {"staleness_token_histogram", histogram}};
  nlohmann::json by_producer = nlohmann::json::object();
  for (auto& [name, p] : producers)
    by_producer[name] = {{"trajectories", p.first}, {"oldest_version", p.second}};
  facts.fields["producers"] = by_producer;
  return facts;
}

void request_evaluation(controller_pointer self, const local_weights& weights) {
  auto& st = self->state;
  if (!st.setup.evaluator || st.evaluating)
    return;  // one at a time; a busy evaluator skips this version
  st.evaluating = true;
  self->request(st.setup.evaluator, caf::infinite, eval_atom::value, weights)
      .then(
          [self](int64_t version, double accuracy, double mean_tokens) {
            auto& s = self->state;
            s.evaluating = false;
            write_metrics(s, {{"event", "eval"},
                              {"time_s", run_seconds(s)},
                              {"version", version},
                              {"accuracy", accuracy},
                              {"response_tokens_mean", mean_tokens}});
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
    for (auto& [id, r] : st.rollouts)
      self->send(caf::actor_cast<rollout_actor>(r.handle), weights);
    return;
  }
  self->request(st.setup.publisher, st.setup.request_timeout, publish_atom::value, weights)
      .then(
          [self](std::vector<weight_delivery>& reports) {
            auto& s = self->state;
            for (auto& r : reports) {
              if (!r.error.empty()) {
                s.window_transfer_errors++;
                spdlog::warn("weights of version {} did not reach {}: {}", r.version, r.subscriber, r.error);
              } else if (r.backend != "in-process") {
                s.window_transfer_s = std::max(s.window_transfer_s, r.seconds);
              }
            }
          },
          [self](caf::error& err) {
            self->state.window_transfer_errors++;
            spdlog::warn("publishing weights failed: {}", describe(err));
          });
}

void on_trained(controller_pointer self, const train_report& report, local_weights& weights,
                const std::shared_ptr<batch_facts>& facts, int64_t count) {
  auto& st = self->state;
  st.training = false;
  st.stats.steps++;
  st.stats.trained += count;
  st.stats.version = report.version;
  st.stats.max_staleness = std::max(st.stats.max_staleness, report.max_staleness);
  if (st.stats.steps == 1)
    st.stats.reward_mean_first = report.reward_mean;
  st.stats.reward_mean_last = report.reward_mean;
  st.trained_tokens += report.tokens;
  st.gate->set_version(report.version);
  publish_weights(self, weights);

  // The metrics line of this step.
  auto now = std::chrono::steady_clock::now();
  auto window = std::max(1e-9, std::chrono::duration<double>(now - st.window_start).count());
  nlohmann::json line = facts->fields;
  line["event"] = "step";
  line["step"] = st.stats.steps;
  line["version"] = report.version;
  line["time_s"] = run_seconds(st);
  line["samples"] = count;
  line["trained_tokens"] = report.tokens;
  line["loss"] = report.loss;
  line["kl"] = report.kl;
  line["grad_norm"] = report.grad_norm;
  line["lr"] = report.lr;
  line["masked_fraction"] =
      static_cast<double>(report.behaviour_masked) / static_cast<double>(std::max<int64_t>(1, report.tokens));
  line["generation_tokens_per_s"] = static_cast<double>(st.window_generated) / window;
  line["training_tokens_per_s"] = static_cast<double>(report.tokens) / std::max(1e-9, report.seconds);
  line["train_seconds"] = report.seconds;
  line["weight_publish_s"] = report.publish_seconds;
  nlohmann::json idle = nlohmann::json::object();
  if (st.setup.trace) {
    auto busy = st.setup.trace->busy_seconds();
    for (auto& [track, seconds] : busy) {
      idle[track] = std::clamp(1.0 - (seconds - st.window_busy[track]) / window, 0.0, 1.0);
      st.window_busy[track] = seconds;
    }
    auto sync = st.setup.trace->seconds_in("weight sync");
    line["weight_sync_s"] = sync - st.window_weight_sync;
    st.window_weight_sync = sync;
  }
  line["idle_fraction"] = idle;
  if (st.setup.publisher) {
    line["weight_transfer_s"] = st.window_transfer_s;  // slowest remote subscriber
    line["weight_transfer_errors"] = st.window_transfer_errors;
    st.window_transfer_s = 0;
    st.window_transfer_errors = 0;
  }
  line["rollout_workers"] = st.rollouts.size();
  line["reward_pools"] = st.rewards.size();
  line["admitted"] = st.stats.admitted;
  line["trained"] = st.stats.trained;
  line["dropped"] = st.stats.dropped;
  line["running"] = st.gate->running();
  line["buffered"] = st.buffer->ready_trajectories();
  write_metrics(st, line);
  st.window_start = now;
  st.window_generated = 0;
  spdlog::debug("step {}/{}: version {}, reward {:.3f}, loss {:.4f}, staleness <= {}", st.stats.steps,
                st.setup.total_steps, report.version, report.reward_mean, report.loss, report.max_staleness);

  bool last = st.stats.steps >= st.setup.total_steps;
  if (st.setup.eval_every > 0 && st.stats.steps % st.setup.eval_every == 0 && !last)
    request_evaluation(self, weights);
  if (last) {
    end_run(self, 0, "run complete");
    return;
  }
  if (st.stopping && !st.ending && !st.end_why.empty()) {
    end_run(self, st.end_code, st.end_why);  // a stop arrived during the step
    return;
  }
  if (st.setup.checkpoint_every > 0 && st.stats.steps % st.setup.checkpoint_every == 0)
    save_checkpoint(self, [self](bool) {
      auto& s = self->state;
      if (s.stopping && !s.ending && !s.end_why.empty())
        end_run(self, s.end_code, s.end_why);
      else
        try_train(self);
    });
  else
    try_train(self);
  fill(self);
}

void try_train(controller_pointer self) {
  auto& state = self->state;
  if (state.training || state.finished || state.ending || state.checkpointing)
    return;
  // Trained now, the batch produces version v + 1 from version v: tokens older
  // than v - eta would exceed the bound.
  auto batch = state.buffer->take_batch(state.setup.batch_size, state.gate->version() - state.setup.eta);
  settle_drops(self);
  if (!batch) {
    if (state.stopping && state.gate->running() == 0 && !state.end_why.empty())
      end_run(self, state.end_code, state.end_why);
    else if (state.stopping && state.gate->running() == 0 && state.pending.empty())
      end_run(self, 0, "the prompt stream is exhausted");
    return;
  }
  auto facts = std::make_shared<batch_facts>(describe_batch(*batch, state.gate->version()));
  std::vector<packed<trajectory>> packed_batch;
  std::vector<uint64_t> positions;  // of the batch's groups in the prompt stream
  for (auto& t : *batch) {
    auto it = state.open_groups.find(t.group_id);
    if (it != state.open_groups.end()) {
      positions.push_back(it->second);
      state.open_groups.erase(it);
    }
    packed_batch.push_back(*pack(t));
  }
  facts->fields["prompt_positions"] = positions;
  auto count = static_cast<int64_t>(batch->size());
  state.training = true;
  self->request(state.setup.trainer, caf::infinite, train_atom::value, std::move(packed_batch))
      .then([self, facts, count](train_report& report,
                                 local_weights& weights) { on_trained(self, report, weights, facts, count); },
            [self](caf::error& err) {
              self->state.training = false;
              finish(self, 1, "the trainer failed: " + describe(err));
            });
}

// With no rollout worker the run cannot progress: it waits member_timeout for one.
void arm_member_deadline(controller_pointer self) {
  auto& st = self->state;
  if (!st.rollouts.empty() || st.member_deadline_armed || st.finished)
    return;
  st.member_deadline_armed = true;
  self->delayed_send(self, st.setup.member_timeout, caf::tick_atom::value);
}

void on_join(controller_pointer self, const std::string& node, const std::string& role, const caf::actor& handle) {
  auto& st = self->state;
  if (!handle || st.finished)
    return;
  auto& members = role == "rollout" ? st.rollouts : st.rewards;
  if (role != "rollout" && role != "reward") {
    spdlog::warn("controller: node {} offered a member of unknown role \"{}\"", node, role);
    return;
  }
  for (auto& [id, m] : members)
    if (m.handle == handle)
      return;
  self->monitor(handle);
  members[st.next_member++] = member{handle, node, 0};
  spdlog::info("controller: a {} joined from node {} ({} rollout worker(s), {} reward pool(s))",
               role == "rollout" ? "rollout worker" : "reward pool", node, st.rollouts.size(), st.rewards.size());
  drain_reward_backlog(self);
  fill(self);
}

// A member on another node is gone: its unfinished samples are generated (or
// scored) again by the others; none is lost or trained twice, since a late
// reply of the lost member would find its request forgotten.
void on_member_down(controller_pointer self, const caf::down_msg& down) {
  auto& st = self->state;
  for (auto* members : {&st.rollouts, &st.rewards}) {
    for (auto it = members->begin(); it != members->end(); ++it) {
      if (it->second.handle.address() != down.source)
        continue;
      auto id = it->first;
      auto node = it->second.node;
      bool rollout = members == &st.rollouts;
      members->erase(it);
      size_t requeued = 0;
      if (rollout) {
        for (auto r = st.generating.begin(); r != st.generating.end();) {
          if (r->second.first != id) {
            ++r;
            continue;
          }
          auto sample = std::move(r->second.second);
          r = st.generating.erase(r);
          sample.attempts--;  // the node's loss is not the sample's fault
          generate_again(self, std::move(sample), "lost node " + node);
          requeued++;
        }
      } else {
        for (auto r = st.scoring.begin(); r != st.scoring.end();) {
          if (r->second.first != id) {
            ++r;
            continue;
          }
          st.reward_backlog.push_front(std::move(r->second.second));
          r = st.scoring.erase(r);
          requeued++;
        }
      }
      spdlog::warn("controller: lost the {} on node {} ({}); {} unfinished sample(s) queued again",
                   rollout ? "rollout worker" : "reward pool", node.empty() ? "(this process)" : node,
                   describe(down.reason), requeued);
      if (st.finished)
        return;
      arm_member_deadline(self);
      drain_reward_backlog(self);
      fill(self);
      return;
    }
  }
}

}  // namespace

controller_actor spawn_controller(caf::actor_system& sys, controller_setup setup) {
  return sys.spawn([setup = std::move(setup)](controller_pointer self) mutable -> controller_actor::behavior_type {
    auto& state = self->state;
    state.setup = std::move(setup);
    state.gate = std::make_unique<staleness_gate>(state.setup.batch_size, state.setup.eta, state.setup.max_concurrent);
    state.buffer = std::make_unique<group_buffer>(state.setup.group_size);
    for (auto& r : state.setup.rollouts)
      state.rollouts[state.next_member++] = member{caf::actor_cast<caf::actor>(r), {}, 0};
    if (state.setup.reward)
      state.rewards[state.next_member++] = member{caf::actor_cast<caf::actor>(state.setup.reward), {}, 0};
    self->set_down_handler([self](caf::down_msg& down) { on_member_down(self, down); });
    arm_member_deadline(self);
    if (!state.setup.metrics_path.empty())
      state.metrics.open(state.setup.metrics_path, std::ios::app);
    if (auto& r = state.setup.resume) {
      // Counters continue; the unfinished groups of the checkpoint are generated again first.
      state.gate->restore(r->version);
      state.stats.version = r->version;
      state.stats.steps = r->steps;
      state.stats.admitted = r->admitted;
      state.stats.trained = r->trained;
      state.stats.dropped = r->dropped;
      state.stats.max_staleness = r->max_staleness;
      state.stats.reward_mean_first = r->reward_mean_first;
      state.stats.reward_mean_last = r->reward_mean_last;
      state.carried_drops = r->drop_reasons;
      state.setup.source->restore(r->source_position);
      state.requeue.assign(r->requeue.begin(), r->requeue.end());
      state.dropped_positions = r->dropped_positions;
      state.next_group = r->next_group;
      state.generated_tokens = r->generated_tokens;
      state.trained_tokens = r->trained_tokens;
      state.elapsed_before = r->elapsed_s;
      write_metrics(state, {{"event", "resume"},
                            {"time_s", r->elapsed_s},
                            {"version", r->version},
                            {"steps", r->steps},
                            {"source_position", r->source_position},
                            {"requeued_groups", r->requeue.size()}});
    }
    if (state.stats.steps >= state.setup.total_steps)
      end_run(self, 0, "run complete");
    else
      fill(self);
    return {
        [self](stats_atom) {
          auto& st = self->state;
          if (!st.finished) {
            st.stats.running = st.gate->running();
            st.stats.buffered = st.buffer->ready_trajectories();
          }
          st.stats.generated_tokens = st.generated_tokens;
          st.stats.trained_tokens = st.trained_tokens;
          return st.stats;
        },
        [self](shutdown_atom, std::string& why) { end_run(self, 0, why); },
        [self](join_atom, std::string& node, std::string& role, caf::actor& handle) {
          on_join(self, node, role, handle);
        },
        [self](caf::tick_atom) {
          auto& st = self->state;
          st.member_deadline_armed = false;
          if (st.rollouts.empty() && !st.finished)
            end_run(self, 1,
                    "no rollout worker for " + std::to_string(st.setup.member_timeout.count() / 1000) +
                        " s; start a node with the rollout role (areal --config TOPOLOGY --node NAME)");
        },
    };
  });
}

}  // namespace areal
