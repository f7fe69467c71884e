// Code answers: the response's last fenced code block, run in the sandbox
// against the task's tests. Two kinds of test, both allowed in one task:
//   - stdin/stdout cases: the program reads the input and must print the
//     expected output (trailing whitespace of lines and trailing blank lines ignored);
//   - assertions: Python statements (e.g. "assert add(2, 3) == 5"), each
//     reported separately. They run in a trusted judge process, never in the
//     program's: the program's functions are called across a pipe and their
//     results come back as plain data (see code_harness.hpp), so no printed
//     line, patched builtin, rigged __eq__ or early exit can pass a test.
// All tests must pass for reward 1 (or the passed fraction with partial credit).
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "areal/reward/sandbox.hpp"
#include "areal/reward/verifiers.hpp"

namespace areal::reward {

struct io_case {
  std::string input;
  std::string expected_output;
};

struct code_task {
  std::vector<io_case> io_cases;
  std::vector<std::string> assertions;
  // Trusted code the judge runs before the assertions (imports, helpers); its
  // names are the task's own, not the program's.
  std::string test_setup;
  // The program's names the assertions may use (e.g. HumanEval's entry point);
  // empty: every name the program defines that the setup does not.
  std::vector<std::string> entry_points;
  double case_time_s = 5.0;    // wall-clock limit of one run
  double total_time_s = 20.0;  // all runs of one verification together
  bool partial_credit = false;
};

struct code_options {
  std::string python = "/usr/bin/python3";
  sandbox_policy policy;
  sandbox_limits limits;  // wall_s and cpu_s are taken from the task per run
};

/// Why `python` cannot run the programs of code tasks on this machine (no such
/// file, not executable), or empty where it can.
std::string interpreter_problem(const std::string& python);

/// The last ```python (or ```py, or plain ```) fenced block of the response.
std::optional<std::string> extract_code(std::string_view response);

/// `cancel` (optional) is checked between runs: set, the verification stops with a timeout verdict.
verification verify_code(std::string_view response, const code_task& task, const code_options& options = {},
                         const std::atomic<bool>* cancel = nullptr);

}  // namespace areal::reward
