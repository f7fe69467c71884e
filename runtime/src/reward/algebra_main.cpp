// areal-algebra: a thread's algebra process (cas_process.hpp), started by
// the reward service with posix_spawn, so that it holds none of the memory of
// the process that asks (a fork would keep every page that process rewrites
// after it, a trainer's weights among them).
//   areal-algebra PARENT_PID     (the socket to the parent is descriptor 3)
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include "cas_process.hpp"

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (argc != 2 || getppid() != static_cast<pid_t>(std::atol(argv[1])))
    return 2;                    // started by hand, or the parent ended before PR_SET_PDEATHSIG was set
  std::signal(SIGINT, SIG_IGN);  // a terminal's Ctrl-C is the parent's to handle
  areal::reward::math::serve_cas(3, areal::reward::math::builtin_comparison);
}
