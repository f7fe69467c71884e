// Finding the helper programs (see helper_programs.hpp).
#include "helper_programs.hpp"

#include <unistd.h>

#include <cstdlib>
#include <vector>

namespace areal::reward {

std::optional<std::string> find_helper_program(const std::string& name, std::string& looked_at) {
  std::vector<std::string> dirs;
  if (auto* env = std::getenv("AREAL_HELPER_DIR"); env && *env)
    dirs = {env};
  else
    dirs = {AREAL_HELPERS_BUILT_DIR, AREAL_HELPERS_INSTALLED_DIR};
  for (auto& dir : dirs) {
    auto path = dir + "/" + name;
    if (access(path.c_str(), X_OK) == 0)
      return path;
    looked_at += (looked_at.empty() ? "" : ", ") + path;
  }
  return std::nullopt;
}

}  // namespace areal::reward
