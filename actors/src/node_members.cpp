// The members of a node other than the controller's (see rl_job.hpp,
// spawn_node_members): they join the run through the controller node; on the
// trainer's node they start the trainer side when the controller's job asks.
#include <ATen/Parallel.h>

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "areal/actors/exception_guard.hpp"
#include "areal/actors/reward_pool.hpp"
#include "areal/actors/rl_job.hpp"
#include "areal/actors/weight_transport.hpp"
#include "areal/kernels/compute_threads.hpp"
#include "areal/reward/code_verifier.hpp"
#include "areal/runtime/log.hpp"
#include "job_parts.hpp"

namespace areal {

using namespace job;

namespace {

struct members_state {
  static inline const char* name = "areal.node_members";
  run_config config;
  node_spec self;   // this node
  node_actor head;  // the controller node's node actor
  std::vector<rollout_actor> rollouts;
  uint64_t model_bytes = 0;
  caf::actor subscriber;
  caf::actor_addr publisher, lost_publisher;  // the one subscribed to, and the last one that went away
  bool rollouts_joined = false;
  std::optional<trainer_side> trainer;  // the trainer's node: once the controller's job asked for it
  std::shared_ptr<tracer> trace;
  std::map<std::string, int> join_attempts;  // by role, while the controller node answers not_ready
  int publisher_attempts = 0;
};

using members_pointer = node_members_actor::stateful_pointer<members_state>;

// Asking the controller node again while it answers not_ready (its warm start
// runs first): soon at first, so that a member joins within tens of
// milliseconds of the job's start (a fixed second made every member of a
// multi-node run join up to a second late, idle time on every run's clock),
// then once a second.
std::chrono::milliseconds retry_backoff(int attempt) {
  return std::chrono::milliseconds(std::min(1000, 20 << std::min(attempt, 6)));
}

// Hands one member to the run; the controller node answers not_ready until
// its job runs (the warm start comes first), so this asks again until then.
void join_run(members_pointer self, const std::string& role, const caf::actor& member) {
  self->request(self->state.head, std::chrono::seconds(10), join_atom::value, role, member)
      .then(
          [role](bool) {
            spdlog::info("{} joined the run", role == "rollout"  ? "a rollout worker"
                                              : role == "reward" ? "the reward pool"
                                                                 : "the trainer's node");
          },
          [self, role, member](caf::error& err) {
            if (err != node_errc::not_ready)
              spdlog::warn("joining the run failed ({}); trying again", describe(err));
            self->delayed_send(self, retry_backoff(self->state.join_attempts[role]++), join_atom::value, role, member);
          });
}

// Subscribes the rollout workers to the run's weight publisher. The
// subscriber is linked (it ends with these members); when it ends first (the
// publisher's node was lost with the trainer) this node asks again, and takes
// the publisher of the trainer that joins next (never the one that went away).
void subscribe_to(members_pointer self, const caf::actor& publisher) {
  auto& st = self->state;
  if (st.rollouts.empty() || !publisher || (st.subscriber && publisher.address() == st.publisher))
    return;             // nothing to subscribe, or subscribed to it already
  if (st.subscriber) {  // to a publisher that went away unnoticed here (its node was lost)
    auto old = std::exchange(st.subscriber, caf::actor{});
    self->unlink_from(old);
    self->send_exit(old, caf::exit_reason::user_shutdown);
    st.lost_publisher = st.publisher;
    spdlog::warn("weights: the controller node announced a new weight publisher; subscribing again to it");
  }
  auto ws = rollout_subscription(st.config, st.self, publisher, st.rollouts, st.model_bytes);
  ws.listener = caf::actor_cast<weights_listener_actor>(self);
  st.publisher = publisher.address();
  st.subscriber = caf::actor_cast<caf::actor>(spawn_weight_subscriber(self->system(), ws));
  self->link_to(st.subscriber);
}

void subscribe_to_weights(members_pointer self) {
  self->request(self->state.head, std::chrono::seconds(10), publisher_atom::value)
      .then(
          [self](caf::actor& publisher) {
            if (publisher.address() == self->state.lost_publisher) {
              self->delayed_send(self, retry_backoff(self->state.publisher_attempts++), publisher_atom::value);
              return;
            }
            self->state.publisher_attempts = 0;
            subscribe_to(self, publisher);
          },
          [self](caf::error& err) {
            if (err != node_errc::not_ready)
              spdlog::warn("asking for the weight publisher failed ({}); trying again", describe(err));
            self->delayed_send(self, retry_backoff(self->state.publisher_attempts++), publisher_atom::value);
          });
}

}  // namespace

node_members_actor spawn_node_members(caf::actor_system& sys, const run_config& config, const node_spec& self_spec,
                                      node_actor controller_node, std::shared_ptr<tracer> trace) {
  return sys.spawn<caf::detached>([config, self_spec, controller_node,
                                   trace](members_pointer self) -> node_members_actor::behavior_type {
    guard_exceptions(self, "node members");
    auto& st = self->state;
    st.config = config;
    st.self = self_spec;
    st.head = controller_node;
    st.trace = trace;
    self->set_exit_handler([self](caf::exit_msg& msg) {
      auto& s = self->state;
      if (msg.source != s.subscriber.address()) {
        if (msg.reason)  // as without a handler: a linked member that failed ends these members
          self->quit(msg.reason);
        return;
      }
      if (!s.rollouts_joined && msg.reason) {  // the first weights cannot be taken: no part in the run
        self->quit(msg.reason);
        return;
      }
      // Without an error it ended with its publisher (the subscriber logged why): at the end of every run
      // as well, where nothing is wrong, so only a failure is a warning.
      if (msg.reason)
        spdlog::warn("weights: the subscription failed ({}); subscribing again to the next publisher",
                     describe(msg.reason));
      else
        spdlog::info(
            "weights: the subscription ended with its publisher; subscribing to the next one while the "
            "run lasts");
      s.lost_publisher = s.publisher;
      s.subscriber = caf::actor{};
      self->delayed_send(self, retry_backoff(s.publisher_attempts++), publisher_atom::value);
    });
    if (self_spec.has(role::trainer))
      join_run(self, "trainer", caf::actor_cast<caf::actor>(self));  // the job asks for the trainer side
    if (self_spec.has(role::reward)) {
      // This node does not see the tasks (the controller's does): a missing interpreter is said, not refused.
      if (auto problem = reward::interpreter_problem(config.reward.python); !problem.empty())
        spdlog::warn("reward.python = {}: {}; code tasks scored on this node get the verdict error",
                     config.reward.python, problem);
      if (auto problem = reward::helper_programs_problem(); !problem.empty())
        spdlog::warn("{}", problem);
      auto pool_config = make_reward_pool_config(config.reward);
      pool_config.trace = trace;
      auto pool = spawn_reward_pool(self->system(), pool_config);
      self->link_to(pool);
      join_run(self, "reward", caf::actor_cast<caf::actor>(pool));
    }
    if (self_spec.has(role::rollout)) {
      try {
        auto threads = static_cast<int>(self_spec.compute_threads);
        kernels::set_compute_threads(threads);
        auto m = make_model(config, self_spec);
        st.model_bytes = static_cast<uint64_t>(m.policy->flat().nbytes());
        auto share = std::make_shared<compute_share>(threads, true, 1);
        st.rollouts =
            spawn_rollout_workers(self->system(), config, m, self_spec, share, trace, 0, self_spec.name + "/rollout-");
        kernels::release_compute_threads();  // this thread is done computing (compute_share.hpp)
        for (auto& r : st.rollouts)
          self->link_to(r);
        spdlog::info("{} rollout worker(s) ready ({} compute threads); waiting for the current weights",
                     st.rollouts.size(), threads);
        subscribe_to_weights(self);
      } catch (const std::exception& e) {
        spdlog::error("cannot start the rollout workers: {}", e.what());
        self->quit(caf::make_error(caf::sec::runtime_error, e.what()));  // the handlers below never run
      }
    }
    return {
        [self](join_atom, std::string& role, caf::actor& member) { join_run(self, role, member); },
        [self, config, self_spec](trainer_atom, std::string& model_dir, std::string& resume_from, int64_t version,
                                  std::string& run_dir) -> caf::result<caf::actor, caf::actor, caf::actor, caf::actor> {
          auto& s = self->state;
          if (!self_spec.has(role::trainer))
            return caf::make_error(caf::sec::invalid_argument, "node " + self_spec.name + " has no trainer role");
          if (!s.trainer) {
            try {
              s.trainer = start_trainer_side(self->system(), config, self_spec, model_dir, resume_from, version,
                                             run_dir, s.trace);
            } catch (const std::exception& e) {
              spdlog::error("cannot start the trainer: {}", e.what());
              return caf::make_error(caf::sec::runtime_error, e.what());
            }
            // The trainer side ends with this node's members, and they with it.
            for (auto a :
                 {caf::actor_cast<caf::actor>(s.trainer->trainer), caf::actor_cast<caf::actor>(s.trainer->store),
                  caf::actor_cast<caf::actor>(s.trainer->publisher)})
              self->link_to(a);
            if (s.trainer->evaluator)
              self->link_to(s.trainer->evaluator);
          }
          auto& t = *s.trainer;
          return caf::result<caf::actor, caf::actor, caf::actor, caf::actor>(
              caf::actor_cast<caf::actor>(t.trainer), caf::actor_cast<caf::actor>(t.store),
              caf::actor_cast<caf::actor>(t.publisher), caf::actor_cast<caf::actor>(t.evaluator));
        },
        [self](publisher_atom) {
          if (!self->state.subscriber)
            subscribe_to_weights(self);
        },
        [self](publisher_atom, caf::actor& publisher) { subscribe_to(self, publisher); },
        [self](weights_atom, int64_t version, std::string& error) {
          auto& s = self->state;
          if (!error.empty()) {
            if (!s.rollouts_joined) {
              spdlog::error("the rollout workers cannot take the run's weights: {}", error);
              self->quit(caf::make_error(weight_errc::size_mismatch, error));
            }
            return;
          }
          if (s.rollouts_joined)
            return;
          s.rollouts_joined = true;
          spdlog::info("received the run's weights (version {}); the rollout workers join", version);
          for (auto& r : s.rollouts)
            join_run(self, "rollout", caf::actor_cast<caf::actor>(r));
        },
    };
  });
}

}  // namespace areal
