// Embeds an areal node actor in this application's own actor system and asks it a question.
#include <iostream>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include <areal/actors/node.hpp>
#include <areal/runtime/blas_core.hpp>

int main(int argc, char** argv) {
  areal::fit_blas_core(argc, argv);  // first: OpenBLAS's kernels fitted to this CPU (may run the program again)
  auto config = areal::parse_config(R"([run]
name = "embedded"
[[nodes]]
name = "embedded-node"
roles = ["controller", "trainer"]
)",
                                    "embedded.toml");
  if (!config.config) {
    std::cerr << config.errors.front() << "\n";
    return 1;
  }
  caf::actor_system_config cfg;
  areal::configure_actor_system(cfg, config.config->cluster);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto node = areal::spawn_node(sys, areal::node_setup{*config.config, config.config->nodes[0],
                                                       caf::actor_cast<areal::done_listener_actor>(caf::actor{self})});
  int rc = 1;
  self->request(node, std::chrono::seconds(10), areal::stats_atom::value)
      .receive(
          [&](areal::packed<areal::node_stats>& reply) {
            auto stats = areal::unpack(reply);
            if (stats && stats->node_name == "embedded-node") {
              std::cout << "consumer: node " << stats->node_name << " answered\n";
              rc = 0;
            }
          },
          [&](caf::error& err) { std::cerr << "consumer: " << areal::describe(err) << "\n"; });
  self->send_exit(node, caf::exit_reason::user_shutdown);
  return rc;
}
