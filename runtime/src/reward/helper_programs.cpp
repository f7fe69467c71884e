// Finding the helper programs (see helper_programs.hpp).
#include "helper_programs.hpp"

#include "areal/reward/sandbox.hpp"

#include <signal.h>
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

pid_t spawn_helper_program(const std::string& path, const std::vector<std::string>& args,
                           const posix_spawn_file_actions_t& actions, bool own_group, int& error) {
  std::vector<std::string> words{path};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words)
    argv.push_back(w.data());
  argv.push_back(nullptr);
  char* no_environment[] = {nullptr};
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (own_group) {
    posix_spawnattr_setpgroup(&attributes, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attributes, flags);
  pid_t pid = -1;
  error = posix_spawn(&pid, path.c_str(), &actions, &attributes, argv.data(), no_environment);
  posix_spawnattr_destroy(&attributes);
  return error == 0 ? pid : -1;
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
