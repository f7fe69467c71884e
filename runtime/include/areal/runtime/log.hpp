// Logging. Debian's CAF has its own logging compiled out, so areal logs for
// itself through spdlog: one line per event on stderr, prefixed with the time
// and the node name so that the output of several nodes can be merged.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace areal::log {

/// Makes the default logger write "time [node] level: message" to stderr.
/// `level` is one of trace, debug, info, warn, error.
void init(const std::string& node_name, const std::string& level = "info");

}  // namespace areal::log
