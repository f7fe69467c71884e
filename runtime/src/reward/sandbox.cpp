// The host's side of a sandbox run: the work directory, the user ids, the
// pipes, the deadline and output cap, and the verdict from the status records.
// The processes inside are sandbox_inside.cpp; the user ids sandbox_uids.cpp.
// The host kills the supervisor's process group at the deadline.
#include "areal/reward/sandbox.hpp"

#include "helper_programs.hpp"
#include "sandbox_inside.hpp"
#include "sandbox_plan.hpp"
#include "sandbox_uids.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

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

// The live processes (not zombies) whose real user is one of `uids`, from /proc.
std::vector<pid_t> processes_of(const std::vector<uint32_t>& uids) {
  std::vector<pid_t> found;
  std::error_code ec;
  for (auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    auto name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream status(entry.path() / "status");
    std::string line;
    bool theirs = false, zombie = false;
    while (std::getline(status, line)) {
      if (line.rfind("State:", 0) == 0)
        zombie = line.find('Z') != std::string::npos;
      if (line.rfind("Uid:", 0) == 0) {
        auto uid = std::strtoul(line.c_str() + 4, nullptr, 10);
        theirs = std::find(uids.begin(), uids.end(), uid) != uids.end();
        break;  // State comes before Uid
      }
    }
    if (theirs && !zombie)
      found.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return found;
}

// Waits (polling every 2 ms) until no process of `uids` is left; at the
// deadline kills those still there and returns how many there were (0: none).
size_t await_no_processes(const std::vector<uint32_t>& uids, std::chrono::steady_clock::duration limit) {
  auto until = std::chrono::steady_clock::now() + limit;
  while (true) {
    auto left = processes_of(uids);
    if (left.empty())
      return 0;
    if (std::chrono::steady_clock::now() >= until) {
      for (auto pid : left)
        kill(pid, SIGKILL);
      return left.size();
    }
    usleep(2000);
  }
}

// The supervisor program to start, or nothing (see sandbox_policy::supervisor).
std::optional<std::string> find_supervisor(const sandbox_policy& policy, std::string& looked_at) {
  if (policy.supervisor.empty())
    return find_helper_program("areal-sandbox-supervisor", looked_at);
  if (access(policy.supervisor.c_str(), X_OK) == 0)
    return policy.supervisor;
  looked_at = policy.supervisor;
  return std::nullopt;
}

// Starts the supervisor of `plan` in a process group of its own: the
// supervisor program, or a fork of this process where there is none (noted).
// Returns its pid, or -1 with `error` set.
pid_t start_supervisor(const inside::child_plan& plan, std::vector<std::string>& notes, std::string& error) {
  std::string looked_at;
  auto program = find_supervisor(*plan.policy, looked_at);
  if (!program) {
    notes.push_back("no sandbox supervisor program (" + looked_at +
                    "): forked this process instead, whose page tables every run copies");
    pid_t pid = fork();
    if (pid == 0)
      inside::run_supervisor(plan);
    if (pid < 0)
      error = std::string{"fork: "} + std::strerror(errno);
    else
      setpgid(pid, pid);  // also done by the child; whichever runs first
    return pid;
  }
  // The plan is in the pipe before the supervisor starts (so no write can meet a closed pipe): a few
  // kilobytes, and the pipe is made large enough for it.
  auto text = inside::encode_plan(plan, getpid());
  int plan_pipe[2];
  if (pipe2(plan_pipe, O_CLOEXEC) != 0) {
    error = std::string{"pipe: "} + std::strerror(errno);
    return -1;
  }
  if (static_cast<size_t>(fcntl(plan_pipe[1], F_GETPIPE_SZ)) < text.size())
    fcntl(plan_pipe[1], F_SETPIPE_SZ, static_cast<int>(std::min<size_t>(text.size(), 1 << 20)));
  fcntl(plan_pipe[1], F_SETFL, O_NONBLOCK);
  auto written = write(plan_pipe[1], text.data(), text.size());
  close(plan_pipe[1]);
  if (written != static_cast<ssize_t>(text.size())) {
    close(plan_pipe[0]);
    error = "the sandbox run's plan (" + std::to_string(text.size()) +
            " bytes: its argv and read-only directories) does not fit in a pipe; shorten them";
    return -1;
  }
  // The descriptors the supervisor uses keep their numbers (a dup2 onto itself
  // clears close-on-exec); every other one of this process is closed on exec.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd : {plan_pipe[0], plan.stdin_read, plan.stdout_write, plan.stderr_write, plan.status_write})
    posix_spawn_file_actions_adddup2(&actions, fd, fd);
  int failed = 0;
  pid_t pid = spawn_helper_program(*program, {std::to_string(plan_pipe[0]), std::to_string(plan.status_write)}, actions,
                                   true, failed);
  posix_spawn_file_actions_destroy(&actions);
  close(plan_pipe[0]);
  if (failed != 0) {
    error = "cannot start the sandbox supervisor " + *program + ": " + std::strerror(failed);
    return -1;
  }
  return pid;
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

  inside::child_plan plan{};
  plan.request = &request;
  plan.policy = &policy;
  plan.switch_users = geteuid() == 0 && policy.drop_privileges;
  std::optional<uid_lease> lease;
  if (plan.switch_users) {
    std::string why;
    lease = uid_lease::acquire(policy, why);
    if (!lease)
      return fail(why);
    plan.uid = plan.gid = lease->program_uid();
    plan.companion_uid = plan.companion_gid = lease->companion_uid();
  } else {
    plan.uid = plan.companion_uid = geteuid();
    plan.gid = plan.companion_gid = getegid();
    result.notes.push_back(geteuid() == 0 ? "privileges not dropped: drop_privileges is off"
                                          : "privileges not dropped: not running as root");
  }
  if (request.companion &&
      (request.companion->argv.empty() || request.companion->argv[0].empty() || request.companion->argv[0][0] != '/'))
    return fail("the companion's argv[0] must be the absolute path of its program");

  auto root =
      policy.work_root.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path{policy.work_root};
  std::string pattern = (root / "areal-sandbox-XXXXXX").string();
  if (!mkdtemp(pattern.data()))
    return fail("cannot create a work directory under " + root.string() + ": " + std::strerror(errno));
  plan.work_dir = pattern;
  auto plain_name = [](const std::string& name) {
    return !(name.empty() || name.find('/') != std::string::npos || name == "." || name == "..");
  };
  // The program owns the work directory; the companion owns peer/ inside it and cannot list the rest.
  auto place = [&](const std::filesystem::path& dir, const std::vector<std::pair<std::string, std::string>>& files,
                   uid_t uid, gid_t gid) -> std::optional<std::string> {
    for (auto& [name, content] : files) {
      if (!plain_name(name))
        return "file name \"" + name + "\" must be a plain name";
      write_file(dir / name, content);
      if (plan.switch_users)
        (void)!chown((dir / name).c_str(), uid, gid);
    }
    if (plan.switch_users && chown(dir.c_str(), uid, gid) != 0)
      return std::string{"chown of the work directory: "} + std::strerror(errno);
    return std::nullopt;
  };
  auto problem = place(plan.work_dir, request.files, plan.uid, plan.gid);
  if (!problem && request.companion) {
    auto peer = std::filesystem::path{plan.work_dir} / "peer";
    if (mkdir(peer.c_str(), 0700) != 0 || chmod(plan.work_dir.c_str(), 0711) != 0)
      problem = std::string{"the companion's directory: "} + std::strerror(errno);
    else
      problem = place(peer, request.companion->files, plan.companion_uid, plan.companion_gid);
  }
  if (problem)
    return remove_tree(plan.work_dir), fail(*problem);

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
  std::string start_error;
  pid_t supervisor = start_supervisor(plan, result.notes, start_error);
  for (int fd : {in_pipe[0], out_pipe[1], err_pipe[1], status_pipe[1]})
    close(fd);
  if (supervisor < 0) {
    for (int fd : {in_pipe[1], out_pipe[0], err_pipe[0], status_pipe[0]})
      close(fd);
    remove_tree(plan.work_dir);
    return fail(start_error);
  }

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
  if (lease && (killed_for_time || killed_for_output)) {
    // Killing the supervisor does not wait for its pid namespace to empty: the
    // namespace's init tears it down after. The lease (and with it the user
    // ids) is released only once the run's users have no process left.
    if (auto left = await_no_processes({lease->program_uid(), lease->companion_uid()}, std::chrono::seconds(5)))
      result.notes.push_back(std::to_string(left) + " process(es) of the run's users still there after 5 s; killed");
  }
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  remove_tree(plan.work_dir);

  bool have_status = false;
  int program_status = 0;
  bool exec_failed = false;
  int exec_errno = 0;
  std::string exec_what;
  using namespace inside;
  for (size_t off = 0; off + sizeof(status_record_t) <= status_bytes.size(); off += sizeof(status_record_t)) {
    status_record_t r;
    std::memcpy(&r, status_bytes.data() + off, sizeof(r));
    r.text[sizeof(r.text) - 1] = 0;
    if (r.kind == note_record)
      result.notes.emplace_back(r.text);
    else if (r.kind == exec_failed_record) {
      exec_failed = true;
      exec_errno = r.value;
      exec_what = r.text;
    } else if (r.kind == status_record) {
      have_status = true;
      program_status = r.value;
      result.cpu_s = static_cast<double>(r.cpu_usec) / 1e6;
    }
  }
  if (exec_failed)
    return fail(exec_errno != 0 ? exec_what + " failed: " + std::strerror(exec_errno) : exec_what);
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
