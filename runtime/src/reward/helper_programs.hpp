// The small programs the reward service starts with posix_spawn instead of
// forking the process it runs in (internal): areal-sandbox-supervisor (sets a
// sandbox run up) and areal-algebra (a thread's GiNaC process). A fork copies
// the caller's page tables, and a long-lived forked child keeps every page
// the caller rewrites after the fork: beside a trainer, its weights and
// optimizer state once more per child.
#pragma once

#include <optional>
#include <string>

namespace areal::reward {

/// The path of helper program `name`: in $AREAL_HELPER_DIR when that is set,
/// else where this build put it, else in the install prefix's libexec/areal;
/// nothing when none is executable (`looked_at` lists where it looked).
std::optional<std::string> find_helper_program(const std::string& name, std::string& looked_at);

}  // namespace areal::reward
