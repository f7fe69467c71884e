// Runs an untrusted program in a fresh process tree and reports what happened.
//
// Each run gets: a private work directory (removed afterwards); new mount,
// network, PID, IPC and UTS namespaces where the host allows them, with a root
// filesystem of its own: the host's system directories read-only
// (`read_only_dirs`, /bin, /lib...), /dev/null, zero, random and urandom, a
// /proc of its own (only the run's processes, each visible only to its own
// user), a private /tmp and the work directory at /tmp/work, and nothing else
// of the host: not its project or home directories (task files and their
// expected answers), not other runs' directories; no network; when
// started as root, user ids of its own (a slot of `uid_slots` leased for the
// run, across processes, so concurrent runs never share a user); resource
// limits (CPU seconds, address space, file size, processes, open files); a
// seccomp filter (no fork, no sockets but AF_UNIX, no signals to other
// processes, no ptrace/mount/namespace/kernel-module calls); a scrubbed
// environment; captured output capped in size; and a wall-clock deadline
// after which the whole process group is killed. Whatever could not be
// applied is listed in the result's `notes`, never silently skipped.
//
// A run may have a companion: a second program started beside the first
// under a different user, connected to it by two pipes (each side reads fd 3
// and writes fd 4). The code verifier runs the untrusted solution as the
// companion of a trusted judge, so the judge's verdicts are out of its reach.
#pragma once

#include <cstdint>
#include <optional>
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
  bool drop_privileges = true;  // to the run's own user ids when running as root
  bool seccomp = true;
  // The user ids runs lease when started as root: slot k is uid_base + 2k (the
  // program) and uid_base + 2k + 1 (its companion). Ids with no account, so
  // nothing on the host belongs to them; slots are leased with lock files, so
  // concurrent runs (in any process on the machine) never share one.
  uint32_t uid_base = 61000;
  uint32_t uid_slots = 64;
  std::string work_root;  // parent of work directories; empty: the system temp directory
  // What the program sees of the host's file system, read-only (plus /bin,
  // /sbin and /lib*, as links or directories, as on the host).
  std::vector<std::string> read_only_dirs = {"/usr", "/etc"};
  // The small program that sets each run up (areal-sandbox-supervisor, started
  // with posix_spawn): forking the calling process instead copies its page
  // tables, in time that grows with its memory (a trainer's weights: ~70 ms
  // per GB here, four forks a run). Empty: the one in $AREAL_HELPER_DIR, else
  // the one this library was built with (its build tree, then its install
  // prefix's libexec/areal). Where none is found the run forks this process,
  // and says so in its notes.
  std::string supervisor;
};

struct sandbox_companion {
  std::vector<std::string> argv;                           // argv[0]: absolute path of the program
  std::vector<std::pair<std::string, std::string>> files;  // written to its own directory (its cwd)
};

struct sandbox_request {
  std::vector<std::string> argv;                           // argv[0]: absolute path of the program
  std::vector<std::pair<std::string, std::string>> files;  // name -> content, written to the work directory
  std::string stdin_data;
  sandbox_limits limits;
  // Started beside the program; its stdout and stderr go to the result's err
  // (never to out), it ends when the program does.
  std::optional<sandbox_companion> companion;
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

/// Why the reward service's helper programs (areal-sandbox-supervisor,
/// areal-algebra; see sandbox_policy::supervisor) cannot be started from here,
/// and what to do, or empty where they can. Without them sandbox runs and
/// GiNaC's algebra processes fork the calling process instead.
std::string helper_programs_problem();

}  // namespace areal::reward
