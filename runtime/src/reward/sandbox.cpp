// The sandbox's process tree:
//
//   host thread ── fork ──► supervisor (new process group; unshares namespaces,
//                            mounts private tmpfs, binds the work directory)
//                              └─ fork ──► init (PID 1 of the new PID namespace;
//                                           reaps, reports the program's status)
//                                            └─ fork ──► program (limits, user,
//                                                         seccomp, execve)
//
// Status travels back on a pipe as fixed-size records (atomic below PIPE_BUF).
// The host kills the supervisor's process group at the deadline; when init
// dies the kernel kills everything left in the PID namespace, so no process
// outlives the run.
#include "areal/reward/sandbox.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/limits.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>

namespace areal::reward {

const char* to_string(sandbox_outcome x) {
  switch (x) {
    case sandbox_outcome::exited:
      return "exited";
    case sandbox_outcome::signaled:
      return "signaled";
    case sandbox_outcome::wall_timeout:
      return "wall_timeout";
    case sandbox_outcome::cpu_timeout:
      return "cpu_timeout";
    case sandbox_outcome::output_limit:
      return "output_limit";
    case sandbox_outcome::blocked_syscall:
      return "blocked_syscall";
    case sandbox_outcome::start_failed:
      return "start_failed";
  }
  return "unknown";
}

namespace {

enum record_kind : int { note_record = 1, exec_failed_record = 2, status_record = 3 };

struct status_record_t {
  int kind;
  int value;       // errno for exec_failed, wait status for status
  long cpu_usec;   // program CPU time (status only)
  char text[200];  // note text
};
static_assert(sizeof(status_record_t) < PIPE_BUF, "records must be written atomically");

void send_record(int fd, int kind, int value, long cpu_usec, const char* text) {
  status_record_t r{};
  r.kind = kind;
  r.value = value;
  r.cpu_usec = cpu_usec;
  if (text)
    std::snprintf(r.text, sizeof(r.text), "%s", text);
  ssize_t ignored = write(fd, &r, sizeof(r));
  (void)ignored;
}

void note_errno(int fd, const char* what) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s not applied: %s", what, std::strerror(errno));
  send_record(fd, note_record, 0, 0, buf);
}

// Default-allow filter that stops what a verified program never needs.
int install_seccomp(pid_t self) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx)
    return -1;
  int rc = 0;
  auto kill_process = SCMP_ACT_KILL_PROCESS;
  rc |= seccomp_rule_add(ctx, kill_process, SCMP_SYS(fork), 0);
  rc |= seccomp_rule_add(ctx, kill_process, SCMP_SYS(vfork), 0);
  // clone is allowed for threads only.
  rc |= seccomp_rule_add(ctx, kill_process, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);  // glibc falls back to clone
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EACCES), SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_NE, AF_UNIX));
  // Signals only to itself.
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(kill), 1,
                         SCMP_A0(SCMP_CMP_NE, static_cast<scmp_datum_t>(self)));
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(tgkill), 1,
                         SCMP_A0(SCMP_CMP_NE, static_cast<scmp_datum_t>(self)));
  rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(tkill), 0);
  for (int call : {SCMP_SYS(ptrace),          SCMP_SYS(process_vm_readv), SCMP_SYS(process_vm_writev),
                   SCMP_SYS(mount),           SCMP_SYS(umount2),          SCMP_SYS(pivot_root),
                   SCMP_SYS(chroot),          SCMP_SYS(unshare),          SCMP_SYS(setns),
                   SCMP_SYS(reboot),          SCMP_SYS(kexec_load),       SCMP_SYS(init_module),
                   SCMP_SYS(finit_module),    SCMP_SYS(delete_module),    SCMP_SYS(bpf),
                   SCMP_SYS(perf_event_open), SCMP_SYS(keyctl),           SCMP_SYS(add_key),
                   SCMP_SYS(request_key),     SCMP_SYS(userfaultfd),      SCMP_SYS(io_uring_setup),
                   SCMP_SYS(setsid),          SCMP_SYS(setpgid)})
    rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), call, 0);
  if (rc == 0)
    rc = seccomp_load(ctx);
  seccomp_release(ctx);
  return rc;
}

void set_limit(int resource, rlim_t soft, rlim_t hard) {
  rlimit r{soft, hard};
  setrlimit(resource, &r);
}

struct child_plan {
  const sandbox_request* request;
  const sandbox_policy* policy;
  std::string work_dir;
  bool as_root;
  uid_t uid;
  gid_t gid;
  int stdin_read, stdout_write, stderr_write, status_write;
  int host_ends[4];  // the host's ends of the pipes: closed at once in the children
};

// Keeps only the status pipe (and, for the program's parent, its stdio ends).
void close_except(std::initializer_list<int> keep, int limit = 1024) {
  for (int fd = 3; fd < limit; ++fd)
    if (std::find(keep.begin(), keep.end(), fd) == keep.end())
      close(fd);
}

[[noreturn]] void run_program(const child_plan& plan, const char* cwd) {
  auto& limits = plan.request->limits;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  dup2(plan.stdin_read, 0);
  dup2(plan.stdout_write, 1);
  dup2(plan.stderr_write, 2);
  int status_fd = fcntl(plan.status_write, F_DUPFD_CLOEXEC, 3);
  for (int fd = 3; fd < 1024; ++fd)
    if (fd != status_fd)
      close(fd);
  if (chdir(cwd) != 0) {
    send_record(status_fd, exec_failed_record, errno, 0, "chdir");
    _exit(127);
  }
  auto cpu = static_cast<rlim_t>(limits.cpu_s + 0.999);
  set_limit(RLIMIT_CPU, cpu, cpu + 1);
  set_limit(RLIMIT_AS, limits.memory_bytes, limits.memory_bytes);
  set_limit(RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes);
  set_limit(RLIMIT_NOFILE, limits.open_files, limits.open_files);
  set_limit(RLIMIT_CORE, 0, 0);
  if (plan.as_root && plan.policy->drop_privileges) {
    set_limit(RLIMIT_NPROC, limits.processes, limits.processes);
    if (setgroups(0, nullptr) != 0 || setgid(plan.gid) != 0 || setuid(plan.uid) != 0) {
      send_record(status_fd, exec_failed_record, errno, 0, "dropping privileges");
      _exit(127);
    }
  }
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (plan.policy->seccomp && install_seccomp(getpid()) != 0)
    send_record(status_fd, note_record, 0, 0, "seccomp filter not applied: seccomp_load failed");
  std::vector<char*> argv;
  for (auto& a : plan.request->argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::string home = std::string{"HOME="} + cwd;
  const char* env[] = {"PATH=/usr/local/bin:/usr/bin:/bin",
                       "LANG=C.UTF-8",
                       "PYTHONDONTWRITEBYTECODE=1",
                       "PYTHONHASHSEED=0",
                       "PYTHONIOENCODING=utf-8",
                       home.c_str(),
                       nullptr};
  execve(argv[0], argv.data(), const_cast<char* const*>(env));
  send_record(status_fd, exec_failed_record, errno, 0, "execve");
  _exit(127);
}

// PID 1 of the namespace: starts the program, reaps everything, reports its status.
[[noreturn]] void run_init(const child_plan& plan, const char* cwd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  pid_t program = fork();
  if (program == 0)
    run_program(plan, cwd);
  // Only the program keeps the stdio pipes, so the host sees end-of-file when it ends.
  close_except({plan.status_write});
  if (program < 0) {
    send_record(plan.status_write, exec_failed_record, errno, 0, "fork");
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  while (wait4(program, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  long cpu =
      (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000L + usage.ru_utime.tv_usec + usage.ru_stime.tv_usec;
  send_record(plan.status_write, status_record, status, cpu, nullptr);
  _exit(0);  // the kernel now kills whatever the program left in the namespace
}

[[noreturn]] void run_supervisor(const child_plan& plan) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  for (int fd : plan.host_ends)
    close(fd);
  std::string cwd = plan.work_dir;
  bool isolated = false;
  if (plan.policy->namespaces) {
    if (unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS) == 0) {
      isolated = true;
    } else {
      note_errno(plan.status_write, "namespaces (mount, network, PID, IPC, UTS)");
      if (unshare(CLONE_NEWNET) != 0)
        note_errno(plan.status_write, "network namespace");
    }
  }
  if (isolated) {
    // Private copies of the world-writable directories; the work directory is
    // bound into the private /tmp so that its path inside is the same for every run.
    int work_fd = open(plan.work_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    bool ok = work_fd >= 0 && mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
    char size_option[64];
    std::snprintf(size_option, sizeof(size_option), "size=%llu,mode=1777",
                  static_cast<unsigned long long>(plan.request->limits.file_bytes * 4));
    for (auto dir : {"/tmp", "/var/tmp", "/dev/shm"})
      if (ok && access(dir, F_OK) == 0)
        ok = mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, size_option) == 0;
    if (ok) {
      std::string source = "/proc/self/fd/" + std::to_string(work_fd);
      ok = mkdir("/tmp/work", 0700) == 0 && mount(source.c_str(), "/tmp/work", nullptr, MS_BIND, nullptr) == 0;
      if (ok)
        cwd = "/tmp/work";
    }
    if (!ok)
      note_errno(plan.status_write, "private /tmp and work directory mount");
  }
  pid_t init = fork();
  if (init == 0)
    run_init(plan, cwd.c_str());
  if (init < 0)
    _exit(127);
  close_except({plan.status_write});
  int status = 0;
  while (waitpid(init, &status, 0) < 0 && errno == EINTR) {
  }
  _exit(0);
}

void write_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

void remove_tree(const std::filesystem::path& dir) {
  std::error_code ec;
  // The program may have removed its own permissions; restore them first.
  for (auto it = std::filesystem::recursive_directory_iterator(
           dir, std::filesystem::directory_options::skip_permission_denied, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_directory(ec))
      std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all, std::filesystem::perm_options::add,
                                   ec);
  std::filesystem::remove_all(dir, ec);
}

}  // namespace

sandbox_result run_sandboxed(const sandbox_request& request, const sandbox_policy& policy) {
  sandbox_result result;
  auto fail = [&](std::string why) {
    result.outcome = sandbox_outcome::start_failed;
    result.error = std::move(why);
    return result;
  };
  if (request.argv.empty() || request.argv[0].empty() || request.argv[0][0] != '/')
    return fail("argv[0] must be the absolute path of the program");

  child_plan plan{};
  plan.request = &request;
  plan.policy = &policy;
  plan.as_root = geteuid() == 0;
  if (plan.as_root && policy.drop_privileges) {
    passwd* user = getpwnam(policy.user.c_str());
    if (!user)
      return fail("user \"" + policy.user + "\" does not exist; create it or set the sandbox user");
    plan.uid = user->pw_uid;
    plan.gid = user->pw_gid;
  } else if (!plan.as_root) {
    result.notes.push_back("privileges not dropped: not running as root");
  }

  auto root =
      policy.work_root.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path{policy.work_root};
  std::string pattern = (root / "areal-sandbox-XXXXXX").string();
  if (!mkdtemp(pattern.data()))
    return fail("cannot create a work directory under " + root.string() + ": " + std::strerror(errno));
  plan.work_dir = pattern;
  for (auto& [name, content] : request.files) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return remove_tree(plan.work_dir), fail("file name \"" + name + "\" must be a plain name");
    write_file(std::filesystem::path{plan.work_dir} / name, content);
  }
  if (plan.as_root && policy.drop_privileges) {
    if (chown(plan.work_dir.c_str(), plan.uid, plan.gid) != 0)
      return remove_tree(plan.work_dir), fail(std::string{"chown of the work directory: "} + std::strerror(errno));
    for (auto& [name, content] : request.files) {
      auto path = std::filesystem::path{plan.work_dir} / name;
      (void)!chown(path.c_str(), plan.uid, plan.gid);
    }
  }

  int in_pipe[2], out_pipe[2], err_pipe[2], status_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 ||
      pipe2(status_pipe, O_CLOEXEC) != 0)
    return remove_tree(plan.work_dir), fail(std::string{"pipe: "} + std::strerror(errno));
  plan.stdin_read = in_pipe[0];
  plan.stdout_write = out_pipe[1];
  plan.stderr_write = err_pipe[1];
  plan.status_write = status_pipe[1];
  plan.host_ends[0] = in_pipe[1];
  plan.host_ends[1] = out_pipe[0];
  plan.host_ends[2] = err_pipe[0];
  plan.host_ends[3] = status_pipe[0];

  auto start = std::chrono::steady_clock::now();
  pid_t supervisor = fork();
  if (supervisor == 0)
    run_supervisor(plan);
  for (int fd : {in_pipe[0], out_pipe[1], err_pipe[1], status_pipe[1]})
    close(fd);
  if (supervisor < 0) {
    for (int fd : {in_pipe[1], out_pipe[0], err_pipe[0], status_pipe[0]})
      close(fd);
    remove_tree(plan.work_dir);
    return fail(std::string{"fork: "} + std::strerror(errno));
  }
  setpgid(supervisor, supervisor);  // also done by the child; whichever runs first

  // Feed stdin, drain output and status, enforce the deadline and the output cap.
  int stdin_fd = in_pipe[1];
  fcntl(stdin_fd, F_SETFL, O_NONBLOCK);
  size_t stdin_written = 0;
  if (request.stdin_data.empty()) {
    close(stdin_fd);
    stdin_fd = -1;
  }
  int out_fd = out_pipe[0], err_fd = err_pipe[0], status_fd = status_pipe[0];
  std::string status_bytes;
  bool killed_for_time = false, killed_for_output = false;
  auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(request.limits.wall_s));
  auto kill_all = [&] { kill(-supervisor, SIGKILL); };
  while (out_fd >= 0 || err_fd >= 0 || status_fd >= 0) {
    pollfd fds[4];
    int n = 0;
    for (int fd : {out_fd, err_fd, status_fd})
      if (fd >= 0)
        fds[n++] = {fd, POLLIN, 0};
    if (stdin_fd >= 0)
      fds[n++] = {stdin_fd, POLLOUT, 0};
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline && !killed_for_time && !killed_for_output) {
      killed_for_time = true;
      kill_all();
    }
    auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    int r =
        poll(fds, static_cast<nfds_t>(n), static_cast<int>(std::max<long long>(10, std::min<long long>(wait_ms, 200))));
    if (r < 0 && errno != EINTR)
      break;
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents)
        continue;
      int fd = fds[i].fd;
      if (fd == stdin_fd) {
        auto w = write(stdin_fd, request.stdin_data.data() + stdin_written, request.stdin_data.size() - stdin_written);
        if (w > 0)
          stdin_written += static_cast<size_t>(w);
        if (w < 0 && errno != EAGAIN) {
          close(stdin_fd);
          stdin_fd = -1;
        } else if (stdin_written == request.stdin_data.size()) {
          close(stdin_fd);
          stdin_fd = -1;
        }
        continue;
      }
      char buf[65536];
      auto got = read(fd, buf, sizeof(buf));
      if (got <= 0) {
        close(fd);
        (fd == out_fd ? out_fd : fd == err_fd ? err_fd : status_fd) = -1;
        continue;
      }
      if (fd == status_fd) {
        status_bytes.append(buf, static_cast<size_t>(got));
        continue;
      }
      auto& sink = fd == out_fd ? result.out : result.err;
      auto room =
          request.limits.output_bytes - std::min(request.limits.output_bytes, result.out.size() + result.err.size());
      sink.append(buf, std::min(room, static_cast<size_t>(got)));
      if (static_cast<size_t>(got) > room && !killed_for_output && !killed_for_time) {
        killed_for_output = true;
        kill_all();
      }
    }
  }
  if (stdin_fd >= 0)
    close(stdin_fd);
  int supervisor_status = 0;
  waitpid(supervisor, &supervisor_status, 0);
  kill_all();  // anything that escaped the namespace teardown (there should be none)
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  remove_tree(plan.work_dir);

  bool have_status = false;
  int program_status = 0;
  int exec_errno = 0;
  std::string exec_what;
  for (size_t off = 0; off + sizeof(status_record_t) <= status_bytes.size(); off += sizeof(status_record_t)) {
    status_record_t r;
    std::memcpy(&r, status_bytes.data() + off, sizeof(r));
    r.text[sizeof(r.text) - 1] = 0;
    if (r.kind == note_record)
      result.notes.emplace_back(r.text);
    else if (r.kind == exec_failed_record) {
      exec_errno = r.value;
      exec_what = r.text;
    } else if (r.kind == status_record) {
      have_status = true;
      program_status = r.value;
      result.cpu_s = static_cast<double>(r.cpu_usec) / 1e6;
    }
  }
  if (exec_errno != 0)
    return fail(exec_what + " failed: " + std::strerror(exec_errno));
  if (killed_for_output) {
    result.outcome = sandbox_outcome::output_limit;
  } else if (killed_for_time) {
    result.outcome = sandbox_outcome::wall_timeout;
  } else if (!have_status) {
    result.outcome = sandbox_outcome::signaled;
    result.signal = SIGKILL;
  } else if (WIFEXITED(program_status)) {
    result.outcome = sandbox_outcome::exited;
    result.exit_code = WEXITSTATUS(program_status);
  } else if (WIFSIGNALED(program_status)) {
    result.signal = WTERMSIG(program_status);
    result.outcome = result.signal == SIGSYS ? sandbox_outcome::blocked_syscall
                     : (result.signal == SIGXCPU || (result.signal == SIGKILL && result.cpu_s >= request.limits.cpu_s))
                         ? sandbox_outcome::cpu_timeout
                     : result.signal == SIGXFSZ ? sandbox_outcome::output_limit
                                                : sandbox_outcome::signaled;
  }
  return result;
}

}  // namespace areal::reward
