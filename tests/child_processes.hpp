// The live child processes of this process, with the program each runs and
// its resident memory, from /proc: what the reward service's helper programs
// are checked by in the tests and measured by in bench_rewards (they must not
// be forks of the process that asks).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

struct child_process {
  int pid = 0;
  std::string program;  // the file it runs (/proc/PID/exe)
  long resident_kb = 0;
};

inline std::vector<child_process> child_processes() {
  std::vector<child_process> found;
  std::error_code ec;
  for (auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    auto name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream status(entry.path() / "status");
    std::string line;
    child_process c;
    c.pid = std::stoi(name);
    bool child = false;
    while (std::getline(status, line)) {
      if (line.rfind("PPid:", 0) == 0)
        child = std::stol(line.substr(5)) == ::getpid();
      if (line.rfind("VmRSS:", 0) == 0)
        c.resident_kb = std::stol(line.substr(6));
    }
    if (!child)
      continue;
    c.program = std::filesystem::read_symlink(entry.path() / "exe", ec).string();
    found.push_back(c);
  }
  return found;
}

/// Memory this process holds and has touched, as a trainer's weights are.
inline std::vector<char> touched_memory(size_t mib) {
  return std::vector<char>(mib << 20, 1);
}
