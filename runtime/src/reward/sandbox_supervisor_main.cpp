// areal-sandbox-supervisor: sets one sandbox run up (sandbox_inside.cpp's
// supervisor), started by the host with posix_spawn instead of a fork of the
// host, whose page tables (a trainer's gigabytes) every fork copies.
//   areal-sandbox-supervisor PLAN_FD STATUS_FD
// The plan (sandbox_plan.hpp) arrives on PLAN_FD; what goes wrong before the
// run starts is reported on STATUS_FD as the supervisor reports it.
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "sandbox_plan.hpp"

using namespace areal::reward::inside;

namespace {

[[noreturn]] void refuse(int status_fd, const std::string& why) {
  status_record_t r{};
  r.kind = exec_failed_record;
  r.value = 0;
  std::snprintf(r.text, sizeof(r.text), "sandbox supervisor: %s", why.c_str());
  ssize_t ignored = write(status_fd, &r, sizeof(r));
  (void)ignored;
  _exit(127);
}

}  // namespace

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (argc != 3)
    return 2;
  int plan_fd = std::atoi(argv[1]), status_fd = std::atoi(argv[2]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(plan_fd, buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      refuse(status_fd, "cannot read the plan");
    text.append(buf, static_cast<size_t>(n));
  }
  close(plan_fd);
  std::unique_ptr<received_plan> received;
  try {
    received = decode_plan(text);
  } catch (const std::exception& e) {
    refuse(status_fd, e.what());
  }
  if (getppid() != received->host)  // the host ended before PR_SET_PDEATHSIG was set: nobody would end this run
    _exit(127);
  run_supervisor(received->plan);
}
