// Runs an untrusted program in a fresh process tree and reports what happened.
//
// Each run gets: a private work directory (removed afterwards); new mount,
// network, PID, IPC and UTS namespaces where the host allows them (private
// tmpfs over /tmp, /var/tmp and /dev/shm; no network; the program cannot see
// or signal anything outside); the unprivileged user `nobody` when started as
// root; resource limits (CPU seconds, address space, file size, processes,
// open files); a seccomp filter (no fork, no sockets but AF_UNIX, no signals
// to other processes, no ptrace/mount/namespace/kernel-module calls); a
// scrubbed environment; captured output capped in size; and a wall-clock
// deadline after which the whole process group is killed. Whatever could not
// be applied is listed in the result's `notes`, never silently skipped.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace areal::reward {

struct sandbox_limits {
  double wall_s = 10.0;
  double cpu_s = 5.0;
  uint64_t memory_bytes = uint64_t{1} << 30;  // address space
  uint64_t file_bytes = uint64_t{16} << 20;   // largest file the program may write
  uint64_t processes = 16;                    // RLIMIT_NPROC of the sandbox user
  uint64_t open_files = 64;
  size_t output_bytes = size_t{1} << 20;  // stdout + stderr kept; more ends the run
};

struct sandbox_policy {
  bool namespaces = true;       // mount, network, PID, IPC, UTS
  bool drop_privileges = true;  // to `user` when running as root
  bool seccomp = true;
  std::string user = "nobody";
  std::string work_root;  // parent of work directories; empty: the system temp directory
};

struct sandbox_request {
  std::vector<std::string> argv;                           // argv[0]: absolute path of the program
  std::vector<std::pair<std::string, std::string>> files;  // name -> content, written to the work directory
  std::string stdin_data;
  sandbox_limits limits;
};

enum class sandbox_outcome {
  exited,           // the program exited by itself (see exit_code)
  signaled,         // killed by a signal it did not get from the sandbox (see signal)
  wall_timeout,     // killed at the wall-clock deadline
  cpu_timeout,      // exceeded its CPU seconds
  output_limit,     // wrote more than output_bytes
  blocked_syscall,  // the seccomp filter stopped it (fork, ptrace, ...)
  start_failed,     // could not be started (see error)
};
const char* to_string(sandbox_outcome x);

struct sandbox_result {
  sandbox_outcome outcome = sandbox_outcome::start_failed;
  int exit_code = -1;
  int signal = 0;
  std::string out;
  std::string err;
  double wall_s = 0;
  double cpu_s = 0;
  std::vector<std::string> notes;  // isolation that could not be applied, and why
  std::string error;               // for start_failed
};

sandbox_result run_sandboxed(const sandbox_request& request, const sandbox_policy& policy = {});

}  // namespace areal::reward
