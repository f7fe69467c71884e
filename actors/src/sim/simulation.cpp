// The driver of virtual-time runs (simulation.hpp): the real controller and
// the simulated members under CAF's test scheduler, whose clock is moved to
// each next timed message once nothing else is left to run.
#include "areal/sim/simulation.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <caf/scheduler/test_coordinator.hpp>

#include "areal/actors/controller.hpp"
#include "sim_members.hpp"

namespace areal::sim {

namespace {

// Prompts of the simulated workload: their tokens are all the simulation reads.
class prompt_source final : public tasks::task_source {
 public:
  std::optional<tasks::task_item> next() override {
    tasks::task_item item;
    item.id = position_++;
    item.prompt = "simulated prompt";
    return item;
  }
  uint64_t position() const override { return position_; }
  void restore(uint64_t position) override { position_ = position; }

 private:
  uint64_t position_ = 0;
};

constexpr int64_t unbounded_eta = int64_t{1} << 30;

}  // namespace

void sim_setup::check() const {
  auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (!costs)
    fail("no cost model: name one (simulate.cost_model)");
  if (devices < 1)
    fail("devices must be at least 1");
  if (batch_prompts < 1 || group_size < 1 || steps < 1)
    fail("batch_prompts, group_size and steps must each be at least 1");
  if (eta < -1)
    fail("eta must be 0 or more, or -1 for unbounded");
  if (colocated && eta != 0)
    fail(
        "a colocated run trains on the devices that generate, so it is synchronous: set eta = 0 (or colocated = "
        "false)");
  if (!colocated && (generation_share <= 0 || generation_share >= 1))
    fail("generation_share must be between 0 and 1 (exclusive): some devices generate, the others train");
  if (engines() < 1)
    fail(
        fmt::format("{} device(s) make no rollout engine of {} device(s); give more devices or a larger "
                    "generation_share",
                    devices, costs->devices_per_engine()));
  if (trainer_devices() < 1)
    fail("no device is left to train: lower generation_share");
  if (shared_cores < 0)
    fail("shared_cores must be 0 (devices of their own) or the number of cores the members share");
  if (shared_cores > 0 && colocated)
    fail("shared_cores models engines and a trainer computing at once; a colocated run never does: unset one");
  if (slots_per_engine() < 1)
    fail(
        fmt::format("an engine's KV cache ({:.0f} tokens) does not hold one sequence of {} prompt and {} response "
                    "tokens",
                    costs->kv_capacity_tokens(), work.prompt_tokens, work.max_new_tokens));
  if (work.prompt_tokens < 1 || work.max_new_tokens < 1 || work.reward_workers < 1)
    fail("prompt_tokens, max_new_tokens and reward_workers must each be at least 1");
}

int64_t sim_setup::engines() const {
  auto generating = colocated ? devices : static_cast<int64_t>(std::llround(double(devices) * generation_share));
  return generating / costs->devices_per_engine();
}

int64_t sim_setup::trainer_devices() const {
  return colocated ? devices : devices - engines() * costs->devices_per_engine();
}

double sim_setup::slowdown(int64_t computing) const {
  return shared_cores > 0 ? std::max(1.0, double(computing) / double(shared_cores)) : 1.0;
}

int64_t sim_setup::slots_per_engine() const {
  if (engine_slots > 0)
    return engine_slots;
  // What the KV cache holds at the mean length, for the whole sequence.
  double per_sequence = double(work.prompt_tokens) + work.mean_response_tokens();
  return static_cast<int64_t>(costs->kv_capacity_tokens() / per_sequence);
}

double sim_result::steady_tokens_per_second() const {
  if (trained.size() < 2)
    return trained_tokens_per_second();
  size_t from = trained.size() / 2 - 1;  // the rate from the end of this step on
  int64_t tokens = 0;
  for (size_t i = from + 1; i < trained.size(); ++i)
    tokens += trained[i].tokens;
  double span = trained.back().seconds - trained[from].seconds;
  return span > 0 ? double(tokens) / span : 0;
}

sim_result simulate(const sim_setup& setup) {
  setup.check();
  auto wall_start = std::chrono::steady_clock::now();
  sim_world world{setup};
  world.slots = setup.slots_per_engine();
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  world.start = sched.clock().now();

  std::vector<caf::actor> engines;
  for (int64_t e = 0; e < setup.engines(); ++e)
    engines.push_back(spawn_engine(sys, world, "engine-" + std::to_string(e)));
  auto scorers = spawn_scorers(sys, world);
  world.engines = engines;
  auto store = spawn_store(sys, world);
  world.store = store;
  auto listener = spawn_listener(sys, world);

  controller_setup c;
  c.source = std::make_unique<prompt_source>();
  c.encode = [n = setup.work.prompt_tokens](const std::string&) { return std::vector<int32_t>(size_t(n), 1); };
  c.group_size = setup.group_size;
  c.batch_size = setup.batch_prompts * setup.group_size;
  c.eta = setup.eta < 0 ? unbounded_eta : setup.eta;
  c.rollout_slots = world.slots;
  c.max_concurrent = setup.max_concurrent > 0 ? setup.max_concurrent : c.rollout_slots * setup.engines();
  c.total_steps = setup.steps;
  c.seed = setup.work.seed;
  for (auto& e : engines)
    c.rollouts.push_back(caf::actor_cast<rollout_actor>(e));
  c.reward = caf::actor_cast<reward_pool_actor>(scorers);
  c.store = caf::actor_cast<sample_store_actor>(store);
  c.request_timeout = std::chrono::hours(24 * 365 * 100);  // virtual time: nothing is late
  c.member_timeout = std::chrono::hours(24 * 365 * 100);
  c.trainer_timeout = std::chrono::hours(24 * 365 * 100);
  c.listener = caf::actor_cast<done_listener_actor>(listener);
  c.remote_weights = !setup.colocated;  // admission counts from the weights the engines hold (sim_members.cpp)
  auto controller = spawn_controller(sys, std::move(c));

  sim_result out;
  // Run everything that can run; then the next timed message, until the run ends.
  for (;;) {
    out.events += static_cast<int64_t>(sched.run());
    if (world.done)
      break;
    if (!sched.trigger_timeout())
      break;
  }
  bool stuck = !world.done;
  for (auto& e : engines)
    caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
  for (auto& a : {scorers, store, listener})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(controller, caf::exit_reason::user_shutdown);
  sched.run();
  if (stuck)
    throw std::runtime_error(fmt::format("the simulated run got stuck after {} of {} steps: no event was left",
                                         world.trained.size(), setup.steps));

  out.exit_code = world.exit_code;
  out.end_reason = world.end_reason;
  out.trained = world.trained;
  out.steps = static_cast<int64_t>(world.trained.size());
  out.virtual_seconds = world.trained.empty() ? 0 : world.trained.back().seconds;
  for (auto& p : world.trained) {
    out.trained_samples += p.samples;
    out.trained_tokens += p.tokens;
    out.max_staleness = std::max(out.max_staleness, p.max_staleness);
  }
  out.generated_tokens = world.generated_tokens;
  out.trained_response_tokens = out.trained_tokens - out.trained_samples * setup.work.prompt_tokens;
  out.dropped_samples = world.dropped_samples;
  out.interruptions = world.interruptions;
  out.prefill_tokens = world.prefill_tokens;
  double span_ns = out.virtual_seconds * 1e9;
  if (span_ns > 0) {
    out.engine_busy_share = double(world.engine_busy_ns) / (span_ns * double(setup.engines()));
    out.reprefill_share = double(world.reprefill_ns) / (span_ns * double(setup.engines()));
    out.trainer_busy_share = double(world.trainer_busy_ns) / span_ns;
  }
  out.schedule_log = std::move(world.log);
  out.schedule_hash = world.hash;
  out.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  out.member_wall_seconds = double(world.member_wall_ns) * 1e-9;
  return out;
}

sim_result simulate_quietly(const sim_setup& setup) {
  struct restore_level {
    spdlog::level::level_enum level = spdlog::get_level();
    ~restore_level() { spdlog::set_level(level); }
  } restore;
  spdlog::set_level(spdlog::level::warn);
  return simulate(setup);
}

}  // namespace areal::sim
