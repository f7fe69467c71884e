// The simulated members of a virtual-time run (simulation.hpp): what the real
// controller talks to. Each is a CAF actor under CAF's deterministic test
// scheduler; time passes only through their delayed messages, whose delays
// the cost model gives. Internal to the simulator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "areal/actors/interfaces.hpp"
#include "areal/sim/simulation.hpp"

namespace areal::sim {

using sim_score_atom = caf::atom_constant<caf::atom("simscore")>;
using sim_scored_atom = caf::atom_constant<caf::atom("simscored")>;
using sim_keep_atom = caf::atom_constant<caf::atom("simkeep")>;
using sim_trained_atom = caf::atom_constant<caf::atom("simtrained")>;
using sim_load_atom = caf::atom_constant<caf::atom("simload")>;  // the other side started or stopped computing

/// What the simulated members share with the driver (one thread: no locks).
struct sim_world {
  explicit sim_world(const sim_setup& s) : setup(s) {}
  const sim_setup& setup;
  int64_t slots = 0;  // sequences one engine holds (setup.slots_per_engine(), computed once)
  caf::actor_clock::time_point start;
  bool done = false;
  int32_t exit_code = 0;
  std::string end_reason;
  // The schedule log and its hash.
  std::string log;
  uint64_t hash = 1469598103934665603ULL;
  // Counters.
  int64_t generated_tokens = 0, interruptions = 0;
  int64_t dropped_samples = 0;  // scored, then let go by the controller (forget_atom)
  int64_t prefill_tokens = 0;  // computed by the engines' prefills, re-prefills included
  int64_t engine_busy_ns = 0, reprefill_ns = 0, trainer_busy_ns = 0;
  std::vector<step_point> trained;
  int64_t member_wall_ns = 0;  // real time spent in the simulated members' handlers
  // Cores shared by the engines and the trainer (cost_model::when_sharing, sim_setup::shared_cores): who
  // computes now.
  int64_t engines_computing = 0;
  bool training = false;
  caf::actor store;
  std::vector<caf::actor> engines;  // every rollout engine, in order (weights go to them node by node)

  /// How many times slower than alone a member computes now (sim_setup::shared_cores).
  double slowdown() const { return setup.slowdown(engines_computing + (training ? 1 : 0)); }
  /// Whether the members' speeds depend on who else computes.
  bool contended() const { return setup.shared_cores > 0 || setup.costs->when_sharing(); }

  /// Nanoseconds of virtual time since the start.
  int64_t now_ns(const caf::actor_clock& clock) const;
  /// One line of the schedule log at virtual time `ns`.
  void record(int64_t ns, const std::string& line);
};

/// A rollout engine with continuous batching (sequences join and leave
/// between decode steps), a bound on the sequences it holds, prefills, and
/// new weights taken by re-prefilling the sequences in flight or by waiting for them.
caf::actor spawn_engine(caf::actor_system& sys, sim_world& world, std::string name);
/// A reward pool of `work.reward_workers` scorers.
caf::actor spawn_scorers(caf::actor_system& sys, sim_world& world);
/// The sample store with the trainer behind it; after a step it sends the new
/// version to the engines (sim_world::engines), node by node.
caf::actor spawn_store(caf::actor_system& sys, sim_world& world);
/// Told when the controller's run ends.
caf::actor spawn_listener(caf::actor_system& sys, sim_world& world);

}  // namespace areal::sim
