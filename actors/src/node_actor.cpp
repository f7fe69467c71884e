// The node actor: handshake, probe exchange, peer monitoring, run end (the
// connection phase of a node other than the controller's is node_connect.cpp).
#include <algorithm>
#include <chrono>
#include <map>

#include <unistd.h>
#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <nlohmann/json.hpp>

#include "areal/actors/exception_guard.hpp"
#include "areal/actors/node.hpp"
#include "areal/actors/rl_job.hpp"
#include "areal/runtime/certs.hpp"
#include "areal/runtime/log.hpp"
#include "node_state.hpp"

namespace areal {

const char* to_string(node_errc x) {
  switch (x) {
    case node_errc::incompatible_peer:
      return "incompatible_peer";
    case node_errc::foreign_cluster:
      return "foreign_cluster";
    case node_errc::unknown_peer:
      return "unknown_peer";
    case node_errc::not_a_node:
      return "not_a_node";
    case node_errc::not_ready:
      return "not_ready";
  }
  return "unknown";
}

namespace node_detail {

int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string join(const std::vector<std::string>& xs) {
  std::string out;
  for (auto& x : xs)
    out += (out.empty() ? "" : ",") + x;
  return out;
}

/// "worker (roles rollout,reward; pid 812 on host1; listens on 127.0.0.1:7101; protocol 1, schema 1)"
std::string identity(const node_hello& h) {
  return h.node_name + " (roles " + join(h.roles) + "; pid " + std::to_string(h.pid) + " on " + h.hostname +
         "; listens on " + h.host + ":" + std::to_string(h.port) + "; protocol " + std::to_string(h.protocol_version) +
         ", schema " + std::to_string(schema_version) + ", " + h.build + ")";
}

/// The trajectory each node sends each peer after the handshake: small, but
/// with every field set, so that a transfer that loses or reorders anything shows.
trajectory probe_trajectory(const std::string& producer, uint64_t seed) {
  trajectory t;
  t.prompt_id = seed;
  t.group_id = seed * 31 + producer.size();
  t.sample_index = 0;
  for (size_t i = 0; i < producer.size(); ++i)
    t.prompt_tokens.push_back(static_cast<int32_t>(producer[i]));
  for (int i = 0; i < 12; ++i) {
    t.output_tokens.push_back(100 + i);
    t.behaviour_logprobs.push_back(-0.125f * static_cast<float>(i + 1));
    t.token_versions.push_back(i < 6 ? 0 : 1);  // interrupted once by a weight update
  }
  t.finish = finish_reason::stop;
  t.reward = 1.0f;
  t.judged = verdict::correct;
  t.verdict_detail = "probe from " + producer;
  t.timestamps.admitted_ns = wall_clock_ns();
  t.timestamps.generation_start_ns = t.timestamps.admitted_ns;
  t.timestamps.generation_end_ns = t.timestamps.admitted_ns;
  t.producer = producer;
  return t;
}

bool is_controller(node_pointer self) {
  return self->state.setup.self.has(role::controller);
}

bool probe_job(node_pointer self) {
  return self->state.setup.config.run.probe_only;
}

// The name of the admitted peer on the sender's node, or empty.
std::string sending_peer(node_pointer self) {
  auto sender = self->current_sender();
  if (!sender)
    return {};
  for (auto& [name, p] : self->state.peers)
    if (p.handle.node() == sender->node())
      return name;
  return {};
}

void finish(node_pointer self, int code, const std::string& why) {
  auto& st = self->state;
  if (st.finished)
    return;
  st.finished = true;
  if (code == exit_ok)
    spdlog::info("node stopping: {}", why);
  else
    spdlog::error("node stopping: {}", why);
  if (st.setup.listener)
    caf::anon_send(st.setup.listener, done_atom::value, static_cast<int32_t>(code), why);
  // The members (linked) end with the node: a normal exit of a linked actor
  // would leave them running, and the process would wait for them until its
  // exit watchdog (every rollout node of a run ended 4 s late, "shutdown did
  // not finish").
  if (st.members)
    self->send_exit(st.members, caf::exit_reason::user_shutdown);
  self->quit();
}

// Ends the run from the controller: tells every peer, waits for the
// acknowledgements (bounded), then stops.
void end_run(node_pointer self, const std::string& why) {
  auto& state = self->state;
  if (state.finished)
    return;
  if (state.peers.empty()) {
    finish(self, exit_ok, why);
    return;
  }
  state.run_ending = true;
  auto pending = std::make_shared<size_t>(state.peers.size());
  for (auto& [name, p] : state.peers) {
    auto peer_name = name;
    auto one_done = [self, pending, why] {
      if (--*pending == 0)
        finish(self, exit_ok, why);
    };
    self->request(p.handle, std::chrono::seconds(2), run_end_atom::value, why)
        .then([one_done](bool) { one_done(); },
              [one_done, peer_name](caf::error& err) {
                spdlog::warn("peer {} did not acknowledge the run end: {}", peer_name, describe(err));
                one_done();
              });
  }
}

void check_run_complete(node_pointer self) {
  auto& st = self->state;
  if (!is_controller(self) || !probe_job(self) || st.all_joined || st.finished || !st.self_probe_done)
    return;
  for (auto& n : st.setup.config.nodes) {
    if (n.name == st.setup.self.name)
      continue;
    auto i = st.peers.find(n.name);
    if (i == st.peers.end() || !i->second.probe_acked || !i->second.probe_received)
      return;
  }
  st.all_joined = true;
  auto hold = st.setup.config.run.hold_s;
  spdlog::info("all {} node(s) joined and exchanged trajectories; ending the run in {} s", st.setup.config.nodes.size(),
               hold);
  self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(hold)),
                     shutdown_atom::value, std::string{"run complete"});
}

// Sends our probe trajectory to `target` and checks the acknowledged checksum.
void send_probe(node_pointer self, const std::string& target_name, node_actor target) {
  auto& state = self->state;
  auto packed_probe = pack(probe_trajectory(state.setup.self.name, state.setup.config.run.seed));
  if (!packed_probe) {
    spdlog::error("cannot encode the probe trajectory: {}", describe(packed_probe.error()));
    return;
  }
  auto expected = checksum(packed_probe->bytes.data(), packed_probe->bytes.size());
  state.stats.trajectories_sent++;
  state.stats.bytes_sent += packed_probe->bytes.size();
  auto timeout = std::chrono::milliseconds(state.setup.config.cluster.connection_timeout_ms);
  self->request(target, timeout, std::move(*packed_probe))
      .then(
          [self, target_name, expected](uint64_t digest) {
            auto& st = self->state;
            if (digest != expected) {
              spdlog::error(
                  "{} acknowledged the probe trajectory with checksum {:016x}, expected {:016x}: bytes were "
                  "altered in transit",
                  target_name, digest, expected);
              return;
            }
            spdlog::info("{} acknowledged our trajectory (checksum {:016x} matches)", target_name, digest);
            if (target_name == st.setup.self.name)
              st.self_probe_done = true;
            else if (auto i = st.peers.find(target_name); i != st.peers.end())
              i->second.probe_acked = true;
            check_run_complete(self);
          },
          [target_name](caf::error& err) {
            spdlog::warn("sending a trajectory to {} failed: {}", target_name, describe(err));
          });
}

// Records a peer after a successful handshake and starts watching it.
void admit_peer(node_pointer self, node_actor handle, const node_hello& hello) {
  auto& st = self->state;
  self->monitor(handle);
  st.peers[hello.node_name] = peer{handle, hello};
  st.stats.peers_connected = static_cast<uint32_t>(st.peers.size());
  auto offset_ms = static_cast<double>(hello.wall_clock_ns - wall_clock_ns()) / 1e6;
  spdlog::info("peer joined: {}; its clock is {:+.1f} ms from ours", identity(hello), offset_ms);
}

// Why `hello` may not join this node, or an empty error.
caf::error refusal(node_pointer self, const node_hello& hello) {
  auto& st = self->state;
  if (hello.protocol_version != st.setup.protocol)
    return caf::make_error(node_errc::incompatible_peer, "node " + hello.node_name + " speaks protocol version " +
                                                             std::to_string(hello.protocol_version) + ", node " +
                                                             st.setup.self.name + " speaks protocol version " +
                                                             std::to_string(st.setup.protocol) +
                                                             "; run the same areal build on every node");
  if (hello.app_id != st.setup.config.cluster.app_id)
    return caf::make_error(node_errc::foreign_cluster, "node " + hello.node_name + " belongs to cluster \"" +
                                                           hello.app_id + "\", this is cluster \"" +
                                                           st.setup.config.cluster.app_id + "\"");
  if (!st.setup.config.find_node(hello.node_name) || hello.node_name == st.setup.self.name)
    return caf::make_error(node_errc::unknown_peer, "node \"" + hello.node_name + "\" is not a peer in " +
                                                        st.setup.config.source + "; check --node and the topology");
  if (auto i = st.peers.find(hello.node_name); i != st.peers.end())
    return caf::make_error(node_errc::unknown_peer,
                           "a node named \"" + hello.node_name + "\" is already connected (pid " +
                               std::to_string(i->second.hello.pid) + " on " + i->second.hello.hostname + ")");
  return {};
}

void on_peer_down(node_pointer self, const caf::down_msg& down) {
  auto& st = self->state;
  for (auto i = st.peers.begin(); i != st.peers.end(); ++i) {
    if (i->second.handle.address() != down.source)
      continue;
    auto name = i->first;
    auto roles = join(i->second.hello.roles);
    // The trainer side of a lost node is gone: a trainer that joins again starts a new one.
    auto node = i->second.handle.node();
    if (st.trainer_members && st.trainer_members.node() == node)
      st.trainer_members = node_members_actor{};
    if (st.publisher && st.publisher.node() == node)
      st.publisher = caf::actor{};
    st.peers.erase(i);
    st.lost.push_back(name);
    st.stats.peers_lost++;
    st.stats.peers_connected = static_cast<uint32_t>(st.peers.size());
    if (st.run_ending || st.finished)
      spdlog::info("peer {} (roles {}) left as the run ended", name, roles);
    else
      spdlog::warn("lost peer {} (roles {}): {}", name, roles, describe(down.reason));
    if (name == st.setup.config.controller_node().name)
      finish(self, exit_lost_controller, "lost the controller node " + name);
    return;
  }
}

void start(node_pointer self, node_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  st.hello = make_hello(st.setup);
  st.stats.node_name = st.setup.self.name;
  self->set_down_handler([self](caf::down_msg& down) { on_peer_down(self, down); });
  // This node's members (linked) stopping on an error stop the node with it.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    auto& s = self->state;
    if (s.members && msg.source == s.members.address() && !s.finished) {
      finish(self, exit_failure, "this node's rollout workers or reward pool stopped: " + describe(msg.reason));
      return;
    }
    self->quit(msg.reason);
  });
  auto connect_timeout = std::chrono::duration_cast<caf::timespan>(
      std::chrono::duration<double>(st.setup.config.cluster.connect_timeout_s));
  if (is_controller(self)) {
    // The local path counts too: a probe to ourselves through the same interface.
    send_probe(self, st.setup.self.name, caf::actor_cast<node_actor>(self));
    if (st.setup.config.nodes.size() > 1 && probe_job(self))
      self->delayed_send(self, connect_timeout, caf::connect_atom::value);  // the join deadline
  } else {
    st.connect_deadline = std::chrono::steady_clock::now() + connect_timeout;
    connect_to_controller(self);
  }
}

node_actor::behavior_type node_behavior(node_pointer self, node_setup setup) {
  guard_exceptions(self, "node " + setup.self.name);
  start(self, std::move(setup));
  return {
      [self](packed<node_hello>& msg) -> caf::result<packed<node_hello>> {
        auto& st = self->state;
        auto hello = unpack(msg);
        if (!hello) {
          spdlog::warn("refused an unreadable hello: {}", describe(hello.error()));
          return std::move(hello.error());
        }
        if (auto err = refusal(self, *hello)) {
          spdlog::warn("refused peer {}: {}", hello->node_name, describe(err));
          return err;
        }
        auto handle = caf::actor_cast<node_actor>(self->current_sender());
        admit_peer(self, handle, *hello);
        st.hello.wall_clock_ns = wall_clock_ns();
        auto reply = pack(st.hello);
        auto promise = self->make_response_promise<packed<node_hello>>();
        promise.deliver(std::move(*reply));
        send_probe(self, hello->node_name, handle);
        return promise;
      },
      [self](packed<trajectory>& msg) -> caf::result<uint64_t> {
        auto& st = self->state;
        auto t = unpack(msg);
        if (!t) {
          spdlog::warn("refused an unreadable trajectory: {}", describe(t.error()));
          return std::move(t.error());
        }
        st.stats.trajectories_received++;
        st.stats.bytes_received += msg.bytes.size();
        auto [low, high] = std::minmax_element(t->token_versions.begin(), t->token_versions.end());
        spdlog::info(
            "received trajectory of prompt {} from {}: {} prompt + {} output tokens, versions {}..{}, "
            "finish {}, reward {} ({})",
            t->prompt_id, t->producer, t->prompt_tokens.size(), t->output_tokens.size(),
            low == t->token_versions.end() ? 0 : *low, high == t->token_versions.end() ? 0 : *high,
            to_string(t->finish), t->reward, to_string(t->judged));
        if (auto i = st.peers.find(t->producer); i != st.peers.end()) {
          i->second.probe_received = true;
          check_run_complete(self);
        }
        return checksum(msg.bytes.data(), msg.bytes.size());
      },
      [self](stats_atom) -> packed<node_stats> {
        auto& st = self->state;
        st.stats.uptime_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - st.started).count();
        return *pack(st.stats);
      },
      [self](join_atom, std::string& role, caf::actor& member) -> caf::result<bool> {
        auto& st = self->state;
        auto peer = sending_peer(self);
        if (peer.empty())
          return caf::make_error(node_errc::unknown_peer, "only a node that shook hands may add members to the run");
        if (role == "trainer") {
          st.trainer_members = caf::actor_cast<node_members_actor>(member);
          spdlog::info("the trainer's node {} joined", peer);
          if (st.trainer_wanted) {
            auto& [model_dir, resume_from, version, run_dir] = st.trainer_request;
            st.trainer_wanted->delegate(st.trainer_members, trainer_atom::value, model_dir, resume_from, version,
                                        run_dir);
            st.trainer_wanted.reset();
          }
          return true;
        }
        if (!st.controller)
          return caf::make_error(node_errc::not_ready, "the RL job has not started yet");
        self->send(caf::actor_cast<controller_actor>(st.controller), join_atom::value, peer, role, member);
        return true;
      },
      [self](publisher_atom) -> caf::result<caf::actor> {
        auto& st = self->state;
        if (sending_peer(self).empty())
          return caf::make_error(node_errc::unknown_peer, "only a node that shook hands may subscribe to weights");
        if (!st.publisher)
          return caf::make_error(node_errc::not_ready, "the RL job has not started yet");
        return st.publisher;
      },
      [self](trainer_atom, std::string& model_dir, std::string& resume_from, int64_t version,
             std::string& run_dir) -> caf::result<caf::actor, caf::actor, caf::actor, caf::actor> {
        auto& st = self->state;
        if (st.trainer_members)
          return self->delegate(st.trainer_members, trainer_atom::value, model_dir, resume_from, version, run_dir);
        // Answered when the trainer's node joins (the job's request carries the deadline).
        st.trainer_request = {model_dir, resume_from, version, run_dir};
        st.trainer_wanted = self->make_response_promise<caf::actor, caf::actor, caf::actor, caf::actor>();
        return *st.trainer_wanted;
      },
      [self](trace_atom) -> caf::result<std::string> {
        auto& st = self->state;
        if (!is_controller(self)) {
          // Our spans, in the controller node's wall clock; tracks named after this node.
          auto shift = trace_clock_to_wall_ns() + st.controller_clock_offset_ns;
          nlohmann::json out = nlohmann::json::array();
          if (st.trace)
            for (auto& s : st.trace->spans()) {
              auto track =
                  s.track.rfind(st.setup.self.name + "/", 0) == 0 ? s.track : st.setup.self.name + "/" + s.track;
              nlohmann::json args = nlohmann::json::object();
              for (auto& [name, value] : s.args)
                args[name] = value;
              out.push_back({track, s.what, s.start_ns + shift, s.end_ns + shift, args});
            }
          return out.dump();
        }
        // The controller node: every peer's spans, merged (a peer that does not answer in time is left out).
        auto promise = self->make_response_promise<std::string>();
        auto merged = std::make_shared<nlohmann::json>(nlohmann::json::array());
        auto pending = std::make_shared<size_t>(st.peers.size());
        if (*pending == 0)
          promise.deliver(merged->dump());
        for (auto& [name, p] : st.peers) {
          auto one_done = [promise, merged, pending]() mutable {
            if (--*pending == 0)
              promise.deliver(merged->dump());
          };
          auto peer_name = name;
          self->request(p.handle, std::chrono::seconds(10), trace_atom::value)
              .then(
                  [merged, one_done](std::string& text) mutable {
                    auto spans = nlohmann::json::parse(text, nullptr, false);
                    if (spans.is_array())
                      for (auto& s : spans)
                        merged->push_back(std::move(s));
                    one_done();
                  },
                  [one_done, peer_name](caf::error& err) mutable {
                    spdlog::warn("no trace spans from {}: {}", peer_name, describe(err));
                    one_done();
                  });
        }
        return promise;
      },
      [self](publisher_atom, caf::actor& controller, caf::actor& publisher) {
        auto& st = self->state;
        st.controller = controller;
        st.publisher = publisher;
        for (auto& [name, peer] : st.peers)  // the rollout nodes subscribe (again) to this one
          self->send(peer.handle, publisher_atom::value, publisher);
      },
      [self](publisher_atom, caf::actor& publisher) {
        auto& st = self->state;
        if (!is_controller(self) && st.members && !sending_peer(self).empty())
          self->send(st.members, publisher_atom::value, publisher);
      },
      [self](run_end_atom, std::string& why) -> bool {
        finish(self, exit_ok, "the controller ended the run: " + why);
        return true;
      },
      [self](shutdown_atom, std::string& why) {
        if (is_controller(self))
          end_run(self, why);
        else
          finish(self, exit_ok, why);
      },
      [self](caf::connect_atom) {
        auto& st = self->state;
        if (st.finished)
          return;
        if (!is_controller(self)) {
          if (st.peers.empty())
            connect_to_controller(self);
          return;
        }
        // On the controller this is the join deadline: every node must have joined by now.
        if (st.all_joined)
          return;
        std::string missing;
        for (auto& n : st.setup.config.nodes)
          if (n.name != st.setup.self.name && !st.peers.count(n.name))
            missing += (missing.empty() ? "" : ", ") + n.name;
        finish(self, exit_unreachable,
               "node(s) " + (missing.empty() ? std::string{"(all connected, probes unanswered)"} : missing) +
                   " did not join within cluster.connect_timeout_s = " +
                   fmt::format("{:g}", st.setup.config.cluster.connect_timeout_s) +
                   " s; start them with areal --config " + st.setup.config.source + " --node NAME");
      },
  };
}

}  // namespace node_detail

using namespace node_detail;

node_hello make_hello(const node_setup& setup) {
  node_hello h;
  h.protocol_version = setup.protocol;
  h.app_id = setup.config.cluster.app_id;
  h.node_name = setup.self.name;
  for (auto r : setup.self.roles)
    h.roles.emplace_back(to_string(r));
  h.host = setup.self.host;
  h.port = setup.self.port;
  h.pid = static_cast<uint32_t>(getpid());
  h.hostname = host_name();
  h.build = std::string{"areal "} + AREAL_VERSION;
  h.wall_clock_ns = wall_clock_ns();
  return h;
}

void keep_openssl_error_queue_fix();  // openssl_error_queue.cpp

void configure_actor_system(caf::actor_system_config& cfg, const cluster_spec& cluster, const std::string& tls_node) {
  cfg.load<caf::io::middleman>();
  if (!tls_node.empty()) {
    keep_openssl_error_queue_fix();
    // Mutual TLS: with a certificate set, CAF's OpenSSL module requires and
    // verifies the peer's certificate against the CA on both sides.
    cfg.load<caf::openssl::manager>();
    auto files = tls_files_for(cluster.certs_dir, tls_node);
    cfg.openssl_certificate = files.certificate;
    cfg.openssl_key = files.key;
    cfg.openssl_cafile = files.ca_certificate;
  }
  cfg.add_message_types<caf::id_block::areal>();
  // Work sharing: idle scheduler threads block on a condition variable. CAF's
  // default work stealing polls when idle (100 yields, then 500 sleeps of 50 us,
  // then 10 ms sleeps, and again after every message): on the demo that was
  // ~20,000 sleeps and ~1,300 yields a second, and the system time they cost,
  // on the cores the models compute on. The actors here do little work per
  // message; the models run in their own threads.
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("middleman.app-identifiers", std::vector<std::string>{"areal:" + cluster.app_id});
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(cluster.heartbeat_interval_ms)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(cluster.connection_timeout_ms)});
}

node_actor spawn_node(caf::actor_system& sys, node_setup setup) {
  return sys.spawn(node_behavior, std::move(setup));
}

}  // namespace areal
