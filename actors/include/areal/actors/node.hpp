// The node: one CAF actor system per process, one node actor in it.
//
// Lifecycle. Every node publishes its node actor on its port. A node that does
// not host the controller connects to the controller node (retrying with
// backoff until cluster.connect_timeout_s), and the two shake hands: each checks
// the other's protocol and schema versions, cluster id and name. Then each
// sends the other a probe trajectory and checks the acknowledged checksum. Once
// every node of the topology has joined (by cluster.connect_timeout_s, else the
// controller stops and names the missing nodes), the controller holds the run
// for run.hold_s and ends it; the other nodes stop when it does. Peers are
// monitored, so a node that dies is reported within the connection timeout.
#pragma once

#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>

#include "areal/actors/interfaces.hpp"
#include "areal/runtime/config.hpp"

namespace areal {

/// Exit codes of a node process (also in `areal --help`).
enum node_exit : int {
  exit_ok = 0,
  exit_failure = 1,
  exit_bad_input = 2,
  exit_unreachable = 3,
  exit_lost_controller = 4,
  exit_refused = 5,
};

struct node_setup {
  run_config config;
  node_spec self;  // this node (roles possibly overridden by --role)
  /// Receives (done_atom, int32_t exit_code, std::string why) once, when the node stops.
  done_listener_actor listener;
  uint32_t protocol = protocol_version;  // what this node claims at the handshake
};

/// Loads the middleman, announces areal's types and applies the cluster settings
/// (application identifier, heartbeat interval, connection timeout). With a
/// node name (a node of a multi-node topology with cluster.security = "tls"),
/// also loads CAF's OpenSSL module with that node's certificate, key and the CA.
void configure_actor_system(caf::actor_system_config& cfg, const cluster_spec& cluster,
                            const std::string& tls_node = {});

/// True when the nodes of this topology talk over mutual TLS.
inline bool uses_tls(const run_config& config) {
  return config.nodes.size() > 1 && config.cluster.tls;
}

/// Spawns the node actor. It connects to the controller node by itself when the
/// topology says so; publishing it on its port is the caller's business.
node_actor spawn_node(caf::actor_system& sys, node_setup setup);

/// This node's handshake record.
node_hello make_hello(const node_setup& setup);

struct node_run_options {
  std::string run_dir;   // the run's output directory
  bool resume = false;   // continue from the checkpoint in run_dir
  bool progress = true;  // the live progress line on stderr
};

/// True when this node runs the whole job in one process (a single-node
/// topology with every role): the RL job of rl_job.hpp.
bool runs_whole_job(const run_config& config, const node_spec& node);

/// True when this node's process runs the RL job (the whole job, or the
/// controller's node of a multi-node RL run): it writes the run's metrics,
/// checkpoints and summary.
bool runs_rl_job(const run_config& config, const node_spec& node);

/// Runs a whole node process: actor system, publishing, signal handling
/// (SIGINT/SIGTERM stop the node cleanly; a run writes its checkpoint first)
/// and shutdown. Returns the exit code.
int run_node(const run_config& config, const node_spec& self, const node_run_options& options);

}  // namespace areal
