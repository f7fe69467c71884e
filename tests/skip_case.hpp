// A test case that cannot run in this build says why and ends its process with
// CTest's skip code (77, SKIP_RETURN_CODE of every areal_test): CTest reports it
// as skipped, never as passed. Each CTest test runs one case, so nothing else is
// cut short there; run by hand, the cases after it in that run do not run.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace areal::testing {

inline void skip_unless(bool runnable, const char* why) {
  if (runnable)
    return;
  std::printf("skipped: %s\n", why);
  std::fflush(stdout);
  std::_Exit(77);
}

}  // namespace areal::testing
