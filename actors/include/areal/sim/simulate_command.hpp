// `areal simulate --config FILE`: the run configuration's [simulate] and [rl]
// sections as a virtual-time run (simulation.hpp); prints what it did and
// writes the JSON and schedule log the section names.
#pragma once

#include <iosfwd>

#include <nlohmann/json.hpp>

#include "areal/runtime/config.hpp"
#include "areal/sim/simulation.hpp"

namespace areal::sim {

/// The simulation a run configuration describes. Throws std::invalid_argument
/// naming the key to change when it cannot be simulated.
sim_setup setup_from(const run_config& config);

/// A result as JSON: its figures and the virtual time, samples and tokens of every step.
nlohmann::json result_json(const sim_result& r);

/// Runs it and prints the result; the exit code (0, or 2 for a configuration it refuses).
int simulate_command(const run_config& config, std::ostream& out, std::ostream& err);

}  // namespace areal::sim
