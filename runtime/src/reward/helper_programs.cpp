// Finding the helper programs (see helper_programs.hpp).
#include "helper_programs.hpp"

#include "areal/reward/sandbox.hpp"

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

std::string helper_programs_problem() {
  std::string missing, looked_at;
  for (auto name : {"areal-sandbox-supervisor", "areal-algebra"})
    if (!find_helper_program(name, looked_at))
      missing += (missing.empty() ? "" : " and ") + std::string{name};
  if (missing.empty())
    return {};
  return "the reward helper program(s) " + missing + " are not found (looked at " + looked_at +
         "): sandbox runs and algebra processes fork this process instead (slower, and an algebra process keeps a "
         "copy of every page this process rewrites); set AREAL_HELPER_DIR to the directory that holds them "
         "(build/libexec/areal, or libexec/areal of the install)";
}

}  // namespace areal::reward
