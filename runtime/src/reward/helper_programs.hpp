// The small programs the reward service starts with posix_spawn instead of
// forking the process it runs in (internal): areal-sandbox-supervisor (sets a
// sandbox run up) and areal-algebra (a thread's GiNaC process). A fork copies
// the caller's page tables, and a long-lived forked child keeps every page
// the caller rewrites after the fork: beside a trainer, its weights and
// optimizer state once more per child.
#pragma once

#include <spawn.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace areal::reward {

/// The path of helper program `name`: in $AREAL_HELPER_DIR when that is set,
/// else where this build put it, else in the install prefix's libexec/areal;
/// nothing when none is executable (`looked_at` lists where it looked).
std::optional<std::string> find_helper_program(const std::string& name, std::string& looked_at);

/// Starts helper program `path` with the arguments `args` after its name,
/// the descriptor changes in `actions`, no environment, no signal blocked and
/// every signal at its default (whatever the calling thread has), in a
/// process group of its own when `own_group`. Its pid, or -1 with `error` set
/// to posix_spawn's error number.
pid_t spawn_helper_program(const std::string& path, const std::vector<std::string>& args,
                           const posix_spawn_file_actions_t& actions, bool own_group, int& error);

}  // namespace areal::reward
