// The algebra process of a thread (see cas_process.hpp).
#include "cas_process.hpp"
#include "helper_programs.hpp"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace areal::reward::math {

namespace {

constexpr size_t max_text = 64 * 1024;  // each side of a request; the readers refuse far less
// The first thing an algebra process sends: the format of its requests and answers. An areal-algebra of
// another build says another (and is replaced by a fork of this process).
constexpr uint32_t wire_format = 1;

bool send_all(int fd, const void* data, size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    auto sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR)
      continue;
    if (sent <= 0)
      return false;
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

bool receive_all(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    auto got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// A request: op, tolerance, the two lengths, the two texts. An answer: known, value.
struct request_head {
  uint8_t op;
  double tolerance;
  uint32_t a_size, b_size;
};
struct answer_wire {
  uint8_t known;
  double value;
};

// This thread's algebra process: its pid and our end of the socket to it.
struct cas_child {
  pid_t pid = -1;
  int fd = -1;
  cas_compute runs = nullptr;  // what the process computes
  bool unavailable = false;    // it could not be started once: compute here from now on

  ~cas_child() { stop(); }

  void stop() {
    if (fd >= 0)
      ::close(fd);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    pid = -1;
    fd = -1;
    runs = nullptr;
  }

  bool start(cas_compute compute) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      return false;
    std::string looked_at;
    auto program = compute == builtin_comparison ? find_helper_program("areal-algebra", looked_at) : std::nullopt;
    pid_t child = program ? spawn(*program, sv[1]) : -1;
    if (child >= 0 && !says_hello(child, sv[0]))
      child = -1;
    if (child < 0) {  // no areal-algebra (or one of another build): a fork of this process
      child = fork_running(compute, sv[1]);
      if (child >= 0 && !says_hello(child, sv[0]))
        child = -1;
    }
    ::close(sv[1]);
    if (child < 0) {
      ::close(sv[0]);
      return false;
    }
    pid = child;
    fd = sv[0];
    runs = compute;
    return true;
  }

  // Whether process `child` sent this build's wire format on `socket` within 5 s; if not, it is ended.
  static bool says_hello(pid_t child, int socket) {
    pollfd p{socket, POLLIN, 0};
    uint32_t format = 0;
    int ready;
    while ((ready = ::poll(&p, 1, 5000)) < 0 && errno == EINTR) {
    }
    if (ready > 0 && receive_all(socket, &format, sizeof format) && format == wire_format)
      return true;
    ::kill(child, SIGKILL);
    while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
    return false;
  }

  // areal-algebra with the socket as its descriptor 3 (see algebra_main.cpp).
  static pid_t spawn(const std::string& program, int socket) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, socket, 3);  // close-on-exec cleared (also when socket is 3)
    posix_spawn_file_actions_addclosefrom_np(&actions, 4);  // this process's sockets and files are not its
    int error = 0;
    pid_t child = spawn_helper_program(program, {std::to_string(::getpid())}, actions, false, error);
    posix_spawn_file_actions_destroy(&actions);
    return child;
  }

  // A fork of this process that runs `compute` (for any function but
  // builtin_comparison, and for that one where areal-algebra is missing).
  static pid_t fork_running(cas_compute compute, int socket) {
    pid_t parent = ::getpid();
    pid_t child;
    {
      std::lock_guard<std::mutex> lock{in_process_cas_mutex()};
      child = ::fork();
    }
    if (child == 0) {
      // Only this thread lives on here: no locks but its own, no exit handlers (_exit).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent)
        _exit(0);
      ::prctl(PR_SET_NAME, "areal-cas", 0, 0, 0);
      ::signal(SIGINT, SIG_IGN);  // a terminal's Ctrl-C is the parent's to handle
      for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGTERM})
        ::signal(sig, SIG_DFL);  // a crash here ends this process quietly; the caller sees it
      int keep = ::dup2(socket, 3);
      if (keep != 3)
        _exit(1);
      ::close_range(4, ~0U, 0);  // the parent's sockets and files are not this process's
      serve_cas(3, compute);
    }
    return child;
  }
};

thread_local cas_child this_thread_child;

}  // namespace

// The algebra process's loop: one request at a time until the socket closes.
[[noreturn]] void serve_cas(int fd, cas_compute compute) {
  if (!send_all(fd, &wire_format, sizeof wire_format))
    _exit(0);
  std::string a, b;
  while (true) {
    request_head head{};
    if (!receive_all(fd, &head, sizeof head) || head.a_size > max_text || head.b_size > max_text)
      _exit(0);
    a.resize(head.a_size);
    b.resize(head.b_size);
    if (!receive_all(fd, a.data(), a.size()) || !receive_all(fd, b.data(), b.size()))
      _exit(0);
    cas_answer answer;
    try {
      answer = compute(static_cast<cas_op>(head.op), a, b, head.tolerance);
    } catch (...) {
      answer = {};
    }
    answer_wire out{static_cast<uint8_t>(answer.known ? 1 : 0), answer.value};
    if (!send_all(fd, &out, sizeof out))
      _exit(0);
  }
}

std::mutex& in_process_cas_mutex() {
  static std::mutex m;
  return m;
}

cas_result run_in_cas_process(cas_compute compute, cas_op op, const std::string& a, const std::string& b,
                              double tolerance, std::chrono::milliseconds limit) {
  auto& child = this_thread_child;
  cas_result result;
  if (child.unavailable || a.size() > max_text || b.size() > max_text)
    return result;  // unavailable
  if (child.pid > 0 && child.runs != compute)
    child.stop();  // it computes something else
  if (child.pid <= 0 && !child.start(compute)) {
    child.unavailable = true;
    return result;
  }
  result.outcome = cas_result::status::failed;
  request_head head{static_cast<uint8_t>(op), tolerance, static_cast<uint32_t>(a.size()),
                    static_cast<uint32_t>(b.size())};
  if (!send_all(child.fd, &head, sizeof head) || !send_all(child.fd, a.data(), a.size()) ||
      !send_all(child.fd, b.data(), b.size())) {
    child.stop();
    return result;
  }
  auto deadline = std::chrono::steady_clock::now() + limit;
  // Most comparisons take tens of microseconds: waiting for them without sleeping at first
  // spares the wake-up of a sleeping thread (it costs more than the comparison on some machines).
  auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
  while (std::chrono::steady_clock::now() < spin_end) {
    pollfd p{child.fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0)
      break;
    sched_yield();
  }
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{child.fd, POLLIN, 0};
    int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready <= 0) {  // past the limit: the process is ended with its computation
      child.stop();
      return result;
    }
    break;
  }
  answer_wire in{};
  if (!receive_all(child.fd, &in, sizeof in)) {  // it crashed
    child.stop();
    return result;
  }
  result.outcome = cas_result::status::answered;
  result.answer = {in.known != 0, in.value};
  return result;
}

}  // namespace areal::reward::math
