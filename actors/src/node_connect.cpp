// Reaching the controller's node (see node_state.hpp): connect through the
// middleman (or the TLS manager), shake hands, admit it, and retry with backoff
// until cluster.connect_timeout_s; refusals that a retry cannot help end the node.
#include <algorithm>
#include <set>

#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>

#include "areal/actors/rl_job.hpp"
#include "areal/runtime/certs.hpp"
#include "areal/runtime/log.hpp"
#include "node_state.hpp"

namespace areal::node_detail {

namespace {

void retry_connect(node_pointer self, const std::string& why) {
  auto& st = self->state;
  auto& target = st.setup.config.controller_node();
  if (std::chrono::steady_clock::now() + st.backoff > st.connect_deadline) {
    finish(self, exit_unreachable,
           "could not reach the controller node " + target.name + " at " + target.host + ":" +
               std::to_string(target.port) + " within " +
               fmt::format("{:g}", st.setup.config.cluster.connect_timeout_s) + " s (" +
               std::to_string(st.connect_attempts) + " attempts; last error: " + why +
               "). Start that node, or check its host and port in " + st.setup.config.source +
               (uses_tls(st.setup.config) ? " (with cluster.security = \"tls\", a controller node without TLS shows as "
                                            "this too)"
                                          : ""));
    return;
  }
  spdlog::debug("controller not reachable yet ({}); retrying in {} ms", why, st.backoff.count());
  self->delayed_send(self, st.backoff, caf::connect_atom::value);
  st.backoff = std::min(st.backoff * 2, std::chrono::milliseconds(2000));
}

}  // namespace

void connect_to_controller(node_pointer self) {
  auto& state = self->state;
  auto& target = state.setup.config.controller_node();
  state.connect_attempts++;
  auto mm = uses_tls(state.setup.config) ? self->system().openssl_manager().actor_handle()
                                         : self->system().middleman().actor_handle();
  auto timeout = std::chrono::milliseconds(state.setup.config.cluster.connection_timeout_ms);
  self->request(mm, timeout, caf::connect_atom::value, target.host, target.port)
      .then(
          [self, target](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
            auto& st = self->state;
            if (!ptr || !self->system().assignable<node_actor>(ifs)) {
              finish(self, exit_refused,
                     "nothing at " + target.host + ":" + std::to_string(target.port) +
                         " speaks the areal node protocol; is another program using that port?");
              return;
            }
            auto handle = caf::actor_cast<node_actor>(ptr);
            st.hello.wall_clock_ns = wall_clock_ns();
            auto sent_ns = st.hello.wall_clock_ns;
            auto hello = pack(st.hello);
            self->request(handle, std::chrono::milliseconds(st.setup.config.cluster.connection_timeout_ms),
                          std::move(*hello))
                .then(
                    [self, handle, target, sent_ns](packed<node_hello>& reply) {
                      // Their clock read halfway through the round trip: the offset, NTP-style.
                      self->state.controller_clock_offset_ns = 0;
                      auto theirs = unpack(reply);
                      if (theirs)
                        self->state.controller_clock_offset_ns =
                            theirs->wall_clock_ns - (sent_ns + (wall_clock_ns() - sent_ns) / 2);
                      if (!theirs) {
                        finish(self, exit_refused, "the controller's hello is unreadable: " + describe(theirs.error()));
                        return;
                      }
                      if (auto err = refusal(self, *theirs)) {
                        finish(self, exit_refused, "refusing the controller: " + describe(err));
                        return;
                      }
                      admit_peer(self, handle, *theirs);
                      send_probe(self, theirs->node_name, handle);
                      auto& s = self->state;
                      if (!probe_job(self) && !s.members) {
                        // The RL run: this node's rollout workers and reward pool join it.
                        s.trace = std::make_shared<tracer>("areal " + s.setup.self.name);
                        s.members = spawn_node_members(self->system(), s.setup.config, s.setup.self, handle, s.trace);
                        self->link_to(s.members);
                      }
                    },
                    [self, target](caf::error& err) {
                      // The controller read our hello and said no (node), or could not read it (wire):
                      // retrying cannot help.
                      if (err.category() == caf::atom("node") || err.category() == caf::atom("wire")) {
                        finish(self, exit_refused,
                               "the controller node " + target.name + " refused us: " + describe(err));
                        return;
                      }
                      retry_connect(self, describe(err));
                    });
          },
          [self, target](caf::error& err) {
            auto& config = self->state.setup.config;
            if (err == caf::sec::disconnect_during_handshake) {
              // The peer ended the connection before BASP's handshake: its TLS
              // layer refused our certificate (or our lack of one).
              finish(self, exit_refused,
                     "the node at " + target.host + ":" + std::to_string(target.port) +
                         " closed the connection during the handshake: it refused this node's credentials (here "
                         "cluster.security = \"" +
                         (config.cluster.tls
                              ? "tls\", certificate " +
                                    tls_files_for(config.cluster.certs_dir, self->state.setup.self.name).certificate
                              : std::string{"plain\""}) +
                         "). Give every node certificates from one CA (areal --config " + config.source +
                         " --make-certs) and the same cluster.security");
              return;
            }
            if (err == caf::sec::incompatible_application_ids || err == caf::sec::incompatible_versions) {
              finish(self, exit_refused,
                     "the node at " + target.host + ":" + std::to_string(target.port) + " refused the connection (" +
                         describe(err) + "): it belongs to another cluster (cluster.app_id differs from \"" +
                         self->state.setup.config.cluster.app_id + "\") or runs another CAF version");
              return;
            }
            retry_connect(self, describe(err));
          });
}

}  // namespace areal::node_detail
