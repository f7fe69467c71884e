// The sandbox's side of a run (internal): what the forked processes do between
// fork and execve, and the status records they send the host.
#pragma once

#include <sys/types.h>

#include <climits>
#include <string>

#include "areal/reward/sandbox.hpp"

namespace areal::reward::inside {

enum record_kind : int { note_record = 1, exec_failed_record = 2, status_record = 3 };

// Status travels back to the host on a pipe as fixed-size records (atomic below PIPE_BUF).
struct status_record_t {
  int kind;
  int value;       // errno for exec_failed, wait status for status
  long cpu_usec;   // program CPU time (status only)
  char text[200];  // note text, or what failed
};
static_assert(sizeof(status_record_t) < PIPE_BUF, "records must be written atomically");

struct child_plan {
  const sandbox_request* request;
  const sandbox_policy* policy;
  std::string work_dir;  // the run's directory on the host
  bool switch_users;     // started as root: the programs run as uid / companion_uid
  uid_t uid, companion_uid;
  gid_t gid, companion_gid;
  int stdin_read, stdout_write, stderr_write, status_write;
  int host_ends[4];  // the host's ends of the pipes: closed at once in the children
};

/// The supervisor: unshares the namespaces, prepares the mounts, forks the
/// namespace's init, which starts the program (and its companion) and reports.
[[noreturn]] void run_supervisor(const child_plan& plan);

}  // namespace areal::reward::inside
