// An actor system configured as areal nodes configure theirs, with a scoped
// actor to talk to the actors under test.
#pragma once

#include <memory>

#include <caf/all.hpp>

#include "areal/actors/node.hpp"

namespace areal::test {

struct actor_test_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<caf::scoped_actor> self;
  actor_test_system() {
    configure_actor_system(cfg, cluster_spec{"test"});
    sys = std::make_unique<caf::actor_system>(cfg);
    self = std::make_unique<caf::scoped_actor>(*sys);
  }
};

}  // namespace areal::test
