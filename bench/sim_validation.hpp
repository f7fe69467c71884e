// bench_simulate's validation on this machine: the real job's rows of
// bench_async_vs_sync (synchronous, eta = 1, 2, 4, 8 on the demo's workload)
// run and measured, and predicted by the simulator with the cost model
// measured here in the same run (cpu_costs.hpp), with the error of each.
#pragma once

#include <ostream>

#include <nlohmann/json.hpp>

namespace areal::bench {

/// Prints the table (and the measured cost model); returns it as JSON.
nlohmann::json validate_on_this_machine(bool quick, int threads, std::ostream& out);

}  // namespace areal::bench
