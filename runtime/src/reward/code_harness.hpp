// The assertion harness of the code verifier (internal): a trusted judge and
// the untrusted solution in two processes, and the judge's report, read strictly.
//
// The solution runs as the sandbox's companion, under a user of its own: it
// loads solution.py into a module of its own and then answers calls. The judge
// never runs the solution's code. It runs the task's setup and each test
// itself; the solution's functions are stand-ins that send their arguments to
// the solution's process and return what comes back, rebuilt from plain data
// (None, bool, int, float, complex, str, bytes, list, tuple, set, frozenset,
// dict): an object with a rigged __eq__ cannot cross, and the comparisons run
// on the judge's side. The tests, their expected values and the run's marker
// reach only the judge (on its stdin), which is not dumpable, so the solution
// cannot read them, print results, change the tests or patch the judge's
// builtins. Exiting early only makes the remaining calls fail.
#pragma once

#include <string>
#include <vector>

#include "areal/reward/code_verifier.hpp"

namespace areal::reward::harness {

/// The judge's and the solution process's Python sources.
const std::string& judge_source();
const std::string& runner_source();

/// What the judge reads on stdin: the marker line, then the task as JSON.
std::string judge_input(const std::string& marker, const code_task& task);

/// The judge's report on its stdout, read strictly: every line must carry the
/// marker; each test reports once, PASS or FAIL; DONE closes a complete
/// report. Anything else (an unknown, duplicated, out-of-range or malformed
/// line) is a protocol violation, and the verdict is wrong.
struct report {
  std::vector<int> state;     // per test: 0 not reported, 1 passed, 2 failed
  std::string first_failure;  // "assertion 3 failed: AssertionError ..."
  std::string load_error;     // the solution did not load
  std::string setup_error;    // the task's own setup failed (a task error, not the solution's)
  std::string violation;      // why the report (or the solution's replies) broke the protocol
  bool done = false;
  size_t passed() const;
};
report read_report(const std::string& out, const std::string& marker, size_t tests);

}  // namespace areal::reward::harness
