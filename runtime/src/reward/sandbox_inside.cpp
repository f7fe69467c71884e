// What the sandbox's processes do between fork and execve:
//
//   host thread ── posix_spawn ──► supervisor (the areal-sandbox-supervisor
//   (a fork where that program    program; new process group; unshares
//    is missing)                   namespaces, builds a root filesystem of its
//                                  own: system directories read-only, private
//                                  /tmp, the work directory; pivots into it)
//                                    └─ fork ──► init (PID 1 of the new PID namespace;
//                                                 mounts its own /proc, reaps,
//                                                 reports the program's status)
//                                                  ├─ fork ──► program (limits, user,
//                                                  │            seccomp, execve)
//                                                  └─ fork ──► companion (the same,
//                                                               as another user)
//
// When init dies the kernel kills everything left in the PID namespace, so no
// process outlives the run.
#include "sandbox_inside.hpp"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/limits.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

namespace areal::reward::inside {

namespace {

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

// Keeps only the listed descriptors above stderr.
void close_except(std::initializer_list<int> keep, int limit = 1024) {
  for (int fd = 3; fd < limit; ++fd)
    if (std::find(keep.begin(), keep.end(), fd) == keep.end())
      close(fd);
}

// One process to start inside: what it runs, where, as whom, on which descriptors.
struct launch {
  const std::vector<std::string>* argv;
  std::string cwd;
  uid_t uid;
  gid_t gid;
  int in, out, err;           // become 0, 1, 2
  int link_read, link_write;  // become 3 and 4 (-1: none)
  const char* what;           // named in a failure record
};

[[noreturn]] void run_program(const child_plan& plan, const launch& l) {
  auto& limits = plan.request->limits;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int status_fd = fcntl(plan.status_write, F_DUPFD_CLOEXEC, 10);
  // Move every descriptor to a high number first, so that the dup2s below cannot clobber one another.
  int moved[5] = {l.in, l.out, l.err, l.link_read, l.link_write};
  for (int& fd : moved)
    if (fd >= 0)
      fd = fcntl(fd, F_DUPFD, 20);
  for (int target = 0; target < 5; ++target)
    if (moved[target] >= 0)
      dup2(moved[target], target);
    else
      close(target);
  for (int fd = 5; fd < 1024; ++fd)
    if (fd != status_fd)
      close(fd);
  auto fail = [&](const char* step) {
    char text[200];
    std::snprintf(text, sizeof(text), "%s: %s", l.what, step);
    send_record(status_fd, exec_failed_record, errno, 0, text);
    _exit(127);
  };
  if (chdir(l.cwd.c_str()) != 0)
    fail("chdir");
  auto cpu = static_cast<rlim_t>(limits.cpu_s + 0.999);
  set_limit(RLIMIT_CPU, cpu, cpu + 1);
  set_limit(RLIMIT_AS, limits.memory_bytes, limits.memory_bytes);
  set_limit(RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes);
  set_limit(RLIMIT_NOFILE, limits.open_files, limits.open_files);
  set_limit(RLIMIT_CORE, 0, 0);
  if (plan.switch_users) {
    set_limit(RLIMIT_NPROC, limits.processes, limits.processes);
    if (setgroups(0, nullptr) != 0 || setgid(l.gid) != 0 || setuid(l.uid) != 0)
      fail("dropping privileges");
  }
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (plan.policy->seccomp && install_seccomp(getpid()) != 0)
    send_record(status_fd, note_record, 0, 0, "seccomp filter not applied: seccomp_load failed");
  std::vector<char*> argv;
  for (auto& a : *l.argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::string home = "HOME=" + l.cwd;
  const char* env[] = {"PATH=/usr/local/bin:/usr/bin:/bin",
                       "LANG=C.UTF-8",
                       "PYTHONDONTWRITEBYTECODE=1",
                       "PYTHONHASHSEED=0",
                       "PYTHONIOENCODING=utf-8",
                       home.c_str(),
                       nullptr};
  execve(argv[0], argv.data(), const_cast<char* const*>(env));
  fail("execve");
  _exit(127);  // not reached: fail() exits
}

// PID 1 of the namespace: its own /proc, then the program (and companion); reaps everything, reports.
[[noreturn]] void run_init(const child_plan& plan, const std::string& cwd, bool isolated) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (isolated) {
    // A /proc of this PID namespace only; hidepid=2: a process sees only its own user's processes.
    unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    if (mount("proc", "/proc", "proc", flags, "hidepid=2") != 0 && mount("proc", "/proc", "proc", flags, nullptr) != 0)
      note_errno(plan.status_write, "private /proc");
  }
  int dev_null = open("/dev/null", O_RDWR | O_CLOEXEC);
  int to_companion[2] = {-1, -1}, from_companion[2] = {-1, -1};
  auto& companion = plan.request->companion;
  if (companion && (pipe2(to_companion, O_CLOEXEC) != 0 || pipe2(from_companion, O_CLOEXEC) != 0)) {
    send_record(plan.status_write, exec_failed_record, errno, 0, "companion pipes");
    _exit(127);
  }
  pid_t program = fork();
  if (program == 0)
    run_program(plan, {&plan.request->argv, cwd, plan.uid, plan.gid, plan.stdin_read, plan.stdout_write,
                       plan.stderr_write, from_companion[0], to_companion[1], "program"});
  if (program < 0) {
    send_record(plan.status_write, exec_failed_record, errno, 0, "fork");
    _exit(127);
  }
  if (companion) {
    pid_t peer = fork();
    if (peer == 0)
      run_program(plan, {&companion->argv, cwd + "/peer", plan.companion_uid, plan.companion_gid, dev_null,
                         plan.stderr_write, plan.stderr_write, to_companion[0], from_companion[1], "companion"});
    if (peer < 0) {
      send_record(plan.status_write, exec_failed_record, errno, 0, "fork of the companion");
      _exit(127);
    }
  }
  // Only the programs keep the stdio pipes, so the host sees end-of-file when they end.
  close_except({plan.status_write});
  int status = 0;
  rusage usage{};
  pid_t reaped;
  while ((reaped = wait4(-1, &status, 0, &usage)) != program)
    if (reaped < 0 && errno != EINTR)
      break;
  long cpu =
      (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000L + usage.ru_utime.tv_usec + usage.ru_stime.tv_usec;
  send_record(plan.status_write, status_record, status, cpu, nullptr);
  _exit(0);  // the kernel now kills whatever is left in the namespace, the companion included
}

// A private /tmp holds four times the largest file the program may write.
std::string private_tmp_options(const child_plan& plan) {
  return "size=" + std::to_string(plan.request->limits.file_bytes * 4) + ",mode=1777";
}

bool bind_read_only(const std::string& source, const std::string& target) {
  return mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) == 0 &&
         mount(nullptr, target.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, nullptr) == 0;
}

// Builds the run's root filesystem on a tmpfs at /tmp and makes it the root:
// the host's system directories read-only (the policy's read_only_dirs, and
// the /bin, /sbin, /lib* links or directories), four device nodes, an empty
// /proc (init mounts its own), a private /tmp of the file limit's size, and
// the run's work directory at /tmp/work. Nothing else of the host exists
// inside: not its home or project directories, not other runs' directories.
// On failure errno says why and `step` which step.
bool enter_minimal_root(const child_plan& plan, int work_fd, const char*& step) {
  // The read-only directories are opened before the root's tmpfs covers /tmp,
  // so that one under /tmp can still be bound (from its descriptor).
  std::vector<std::pair<std::string, int>> read_only;
  for (auto& dir : plan.policy->read_only_dirs) {
    struct stat st {};
    if (dir.empty() || dir[0] != '/' || stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      continue;
    int fd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
      read_only.emplace_back(dir, fd);
  }
  step = "tmpfs root";
  if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755") != 0)
    return false;
  const std::string root = "/tmp";
  step = "private /tmp and the work directory";
  auto size_option = private_tmp_options(plan);
  if (mkdir((root + "/tmp").c_str(), 01777) != 0 ||
      mount("tmpfs", (root + "/tmp").c_str(), "tmpfs", MS_NOSUID | MS_NODEV, size_option.c_str()) != 0 ||
      mkdir((root + "/tmp/work").c_str(), 0711) != 0)
    return false;
  std::string work_source = "/proc/self/fd/" + std::to_string(work_fd);
  if (mount(work_source.c_str(), (root + "/tmp/work").c_str(), nullptr, MS_BIND, nullptr) != 0)
    return false;
  step = "system directories";
  for (auto& [dir, fd] : read_only) {
    // Parents first, e.g. /opt for /opt/python.
    for (size_t slash = dir.find('/', 1); slash != std::string::npos; slash = dir.find('/', slash + 1))
      mkdir((root + dir.substr(0, slash)).c_str(), 0755);
    bool ok = (mkdir((root + dir).c_str(), 0755) == 0 || errno == EEXIST) &&
              bind_read_only("/proc/self/fd/" + std::to_string(fd), root + dir);
    close(fd);
    if (!ok)
      return false;
  }
  for (auto top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    struct stat st {};
    if (lstat(top, &st) != 0)
      continue;
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      auto n = readlink(top, target, sizeof(target) - 1);
      if (n < 0)
        return false;
      target[n] = 0;
      if (symlink(target, (root + top).c_str()) != 0)
        return false;
    } else if (S_ISDIR(st.st_mode) && (mkdir((root + top).c_str(), 0755) != 0 || !bind_read_only(top, root + top))) {
      return false;
    }
  }
  step = "/dev";
  if (mkdir((root + "/dev").c_str(), 0755) != 0)
    return false;
  for (auto node : {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"}) {
    int fd = open((root + node).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
    if (fd < 0)
      return false;
    close(fd);
    if (mount(node, (root + node).c_str(), nullptr, MS_BIND, nullptr) != 0)
      return false;
  }
  for (auto [link, target] : {std::pair{"/dev/fd", "/proc/self/fd"}, std::pair{"/dev/stdin", "/proc/self/fd/0"},
                              std::pair{"/dev/stdout", "/proc/self/fd/1"}, std::pair{"/dev/stderr", "/proc/self/fd/2"}})
    if (symlink(target, (root + link).c_str()) != 0)
      return false;
  if (mkdir((root + "/proc").c_str(), 0555) != 0)
    return false;
  step = "pivot_root";
  if (chdir(root.c_str()) != 0 || syscall(SYS_pivot_root, ".", ".") != 0 || umount2(".", MNT_DETACH) != 0 ||
      chdir("/") != 0)
    return false;
  step = "read-only root";
  return mount(nullptr, "/", nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) == 0;
}

// Without a root of its own (see above): private tmpfs over the host's
// world-writable directories and the work directory bound at /tmp/work.
bool enter_private_dirs(const child_plan& plan, int work_fd) {
  auto size_option = private_tmp_options(plan);
  for (auto dir : {"/tmp", "/var/tmp", "/run/lock", "/dev/shm"})
    if (access(dir, F_OK) == 0 && mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, size_option.c_str()) != 0)
      return false;
  std::string source = "/proc/self/fd/" + std::to_string(work_fd);
  return mkdir("/tmp/work", 0711) == 0 && mount(source.c_str(), "/tmp/work", nullptr, MS_BIND, nullptr) == 0;
}

}  // namespace

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
    int work_fd = open(plan.work_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    bool ok = work_fd >= 0 && mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
    const char* step = "a private mount table";
    if (ok && !enter_minimal_root(plan, work_fd, step)) {
      char what[160];
      std::snprintf(what, sizeof(what), "a root filesystem of its own (%s)", step);
      note_errno(plan.status_write, what);
      // A failed step may have left mounts on /tmp; the fallback starts from the host's.
      while (umount2("/tmp", MNT_DETACH) == 0) {
      }
      ok = enter_private_dirs(plan, work_fd);
      if (!ok)
        note_errno(plan.status_write, "private /tmp and work directory mount");
    }
    if (ok)
      cwd = "/tmp/work";
    if (work_fd >= 0)
      close(work_fd);
  }
  pid_t init = fork();
  if (init == 0)
    run_init(plan, cwd, isolated);
  if (init < 0)
    _exit(127);
  close_except({plan.status_write});
  int status = 0;
  while (waitpid(init, &status, 0) < 0 && errno == EINTR) {
  }
  _exit(0);
}

}  // namespace areal::reward::inside
