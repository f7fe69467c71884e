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

/// Throws std::invalid_argument where simulate.json or simulate.log cannot be
/// written (no such folder): checked before a simulation, which may take minutes.
void check_outputs(const simulate_spec& c);

/// Writes one of those outputs whole and says so on `out`; false, with the
/// reason on `err`, where it could not be written.
bool write_output(const std::string& path, const std::string& contents, const std::string& what, std::ostream& out,
                  std::ostream& err);

/// Runs it and prints the result; the exit code (0, or 2 for a configuration it refuses).
int simulate_command(const run_config& config, std::ostream& out, std::ostream& err);

}  // namespace areal::sim
