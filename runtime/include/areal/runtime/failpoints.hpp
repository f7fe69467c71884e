// Failpoints: faults a chaos run injects from inside a process, where no signal
// from outside reaches (a verifier that hangs, a weight transfer cut mid-way).
// They are off unless the environment variable AREAL_FAILPOINTS names them,
//   AREAL_FAILPOINTS="reward.verifier_hang=0.02,weights.transfer_cut=0.3"
// (each with the probability that it fires when its code passes), and a process
// with any on says so at start; every firing is logged as "failpoint NAME fired".
#pragma once

#include <string>
#include <string_view>

namespace areal::failpoints {

/// The failpoints there are. When it fires,
/// - reward.verifier_hang: the verification hangs until the reward pool gives up on it at its deadline;
/// - weights.transfer_cut: the sending side of a bulk weight link stops half-way through a version and
///   closes the link;
/// - weights.slow_fetch: a weight subscriber waits a second before it fetches an announced version (a
///   node on a slow link).
inline constexpr std::string_view known[] = {"reward.verifier_hang", "weights.transfer_cut", "weights.slow_fetch"};

/// Reads AREAL_FAILPOINTS (and AREAL_FAILPOINTS_SEED, which seeds the draws
/// together with the process id). Returns what was wrong with it ("" when it is
/// fine or unset): an unknown name, or a probability outside [0, 1].
std::string configure_from_environment();

/// Sets the failpoints from `spec` (the variable's syntax; "" turns all off).
/// Returns what was wrong ("" when fine); on an error nothing changes.
std::string configure(const std::string& spec, unsigned long long seed);

/// The failpoints on, as "name=p, name=p" ("" when none).
std::string describe_active();

/// True when `name` fires this time; false always when it is off. Thread-safe.
bool fire(std::string_view name);

}  // namespace areal::failpoints
