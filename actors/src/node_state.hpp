// The node actor's state and the functions its two source files share:
// node_actor.cpp (handshake, probes, peers, run end) and node_connect.cpp
// (reaching the controller's node, with retries). Internal to actors/.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <caf/all.hpp>

#include "areal/actors/node.hpp"
#include "areal/runtime/trace.hpp"

namespace areal::node_detail {

struct peer {
  node_actor handle;
  node_hello hello;
  bool probe_acked = false;     // our probe reached it intact
  bool probe_received = false;  // its probe reached us
};

struct node_state {
  static inline const char* name = "areal.node";
  node_setup setup;
  node_hello hello;
  std::map<std::string, peer> peers;
  std::vector<std::string> lost;  // names of peers lost so far
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point connect_deadline;
  std::chrono::milliseconds backoff{100};
  int connect_attempts = 0;
  bool self_probe_done = false;
  bool all_joined = false;
  bool finished = false;
  bool run_ending = false;  // the controller's node told its peers the run ended: they leave now
  node_stats stats;
  caf::actor controller;  // RL, controller node: the job's controller and weight publisher
  caf::actor publisher;
  node_members_actor trainer_members;  // RL, controller node: the members of the trainer's node, once joined
  std::optional<caf::typed_response_promise<caf::actor, caf::actor, caf::actor, caf::actor>> trainer_wanted;
  std::tuple<std::string, std::string, int64_t, std::string> trainer_request;
  node_members_actor members;              // RL, other nodes: the agent of this node's rollout workers and reward pool
  std::shared_ptr<tracer> trace;           // RL, other nodes: the members' spans, for the controller node's trace
  int64_t controller_clock_offset_ns = 0;  // the controller node's wall clock minus ours (at the handshake)
};

using node_pointer = node_actor::stateful_pointer<node_state>;

int64_t wall_clock_ns();
bool probe_job(node_pointer self);
/// Ends this node's part: the listener is told (exit code, why).
void finish(node_pointer self, int code, const std::string& why);
/// Why a peer's hello is refused, or no error.
caf::error refusal(node_pointer self, const node_hello& hello);
void admit_peer(node_pointer self, node_actor handle, const node_hello& hello);
void send_probe(node_pointer self, const std::string& target_name, node_actor target);
/// Asks the middleman for the controller's node actor and shakes hands with it.
void connect_to_controller(node_pointer self);

}  // namespace areal::node_detail
