// Runs `areal` as a child process for the multi-process tests: output goes to
// a log file that the test reads while the node runs; every wait is bounded,
// and a process still running at the end of the test is killed and reaped.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace areal::test {

/// A directory of its own for one test, removed afterwards (kept, to read its
/// logs, when the environment sets AREAL_TEST_KEEP).
struct scratch_dir {
  std::filesystem::path path;
  explicit scratch_dir(const std::string& name) {
    path = std::filesystem::temp_directory_path() / ("areal-" + name + "-" + std::to_string(getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    if (std::getenv("AREAL_TEST_KEEP"))
      return;
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(const std::string& file, const std::string& text) const {
    auto p = path / file;
    std::ofstream(p) << text;
    return p.string();
  }
};

/// A file's bytes (empty when it cannot be read).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// `count` distinct loopback ports that were free a moment ago: all are held at
/// once while they are chosen, so that no two are the same (ports chosen one
/// after another, each released before the next, once clashed).
inline std::vector<uint16_t> free_ports(size_t count) {
  std::vector<int> held;
  std::vector<uint16_t> ports;
  for (size_t i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    held.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : held)
    close(fd);
  return ports;
}

/// A loopback port that was free a moment ago.
inline uint16_t free_port() {
  return free_ports(1).front();
}

/// The single-node default (configs/single_node.toml) made CI-sized, with `more` arguments after it.
inline std::vector<std::string> ci_sized_default(const std::vector<std::string>& more = {}) {
  std::vector<std::string> args{"--config", AREAL_SOURCE_DIR "/configs/single_node.toml",
                                "--set",    "model.preset=micro",
                                "--set",    "sft.steps=5",
                                "--set",    "eval.prompts=8",
                                "--set",    "eval.every=0",
                                "--set",    "rl.batch_size=16",
                                "--set",    "rl.max_new_tokens=8",
                                "--set",    "reward.workers=1"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

class node_process {
 public:
  /// Runs `program` (the areal binary unless another is named) with `args`.
  node_process(const std::vector<std::string>& args, std::filesystem::path log, const std::filesystem::path& cwd,
               const std::string& program = AREAL_BINARY)
      : log_(std::move(log)) {
    std::vector<std::string> argv_storage{program};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_storage)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
    if (posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv.data(), environ) != 0)
      pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }

  ~node_process() {
    if (running()) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  node_process(const node_process&) = delete;
  node_process& operator=(const node_process&) = delete;

  bool started() const { return pid_ > 0; }
  bool running() const { return pid_ > 0 && !code_; }
  void kill(int sig) { ::kill(pid_, sig); }

  std::string log() const {
    std::ifstream in(log_);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }

  /// Waits until the log contains `text` (true) or `limit` passes (false).
  bool wait_for(const std::string& text, std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (log().find(text) != std::string::npos)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return log().find(text) != std::string::npos;
  }

  /// The exit code (128 + signal when killed), or nothing if still running after `limit`.
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!code_) {
      int status = 0;
      auto r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_)
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      else if (std::chrono::steady_clock::now() >= deadline)
        break;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return code_;
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  std::optional<int> code_;
};

}  // namespace areal::test
