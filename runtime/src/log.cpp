// Logging: one spdlog logger per process, with the node's name in every line (see log.hpp).
#include "areal/runtime/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

namespace areal::log {

void init(const std::string& node_name, const std::string& level) {
  auto logger =
      spdlog::stderr_logger_mt("areal." + node_name + "." + std::to_string(reinterpret_cast<uintptr_t>(&node_name)));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e [" + node_name + "] %l: %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::trace);  // tests and operators read the log while the node runs
  spdlog::set_default_logger(logger);
}

}  // namespace areal::log
