// The code verifier: a program run against its tests in the sandbox, and the verdict (see code_verifier.hpp).
#include "areal/reward/code_verifier.hpp"

#include "code_harness.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include <unistd.h>

#include <fmt/format.h>

namespace areal::reward {

namespace {

std::string normalize_output(std::string_view text) {
  std::string out;
  size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find('\n', start);
    auto line = text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    auto last = line.find_last_not_of(" \t\r");
    out += std::string{line.substr(0, last == std::string_view::npos ? 0 : last + 1)};
    out += '\n';
    if (end == std::string_view::npos)
      break;
    start = end + 1;
  }
  while (!out.empty() && out.back() == '\n')
    out.pop_back();
  return out;
}

std::string last_line(const std::string& text) {
  auto end = text.find_last_not_of("\n ");
  if (end == std::string::npos)
    return "";
  auto start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end + 1 - (start == std::string::npos ? 0 : start + 1));
}

// What a run that did not pass says about the program.
verification judge_failure(const sandbox_result& r, const std::string& what) {
  switch (r.outcome) {
    case sandbox_outcome::wall_timeout:
    case sandbox_outcome::cpu_timeout:
      return {verdict::timeout, 0.0f, what + ": time limit exceeded (" + to_string(r.outcome) + ")"};
    case sandbox_outcome::output_limit:
      return {verdict::sandbox_violation, 0.0f, what + ": output or file size limit exceeded"};
    case sandbox_outcome::blocked_syscall:
      return {verdict::sandbox_violation, 0.0f, what + ": a forbidden system call (e.g. fork) was stopped"};
    case sandbox_outcome::signaled:
      return {verdict::sandbox_violation, 0.0f, what + ": terminated by signal " + std::to_string(r.signal)};
    case sandbox_outcome::start_failed:
      return {verdict::error, 0.0f, what + ": the sandbox could not start the program: " + r.error};
    case sandbox_outcome::exited:
      break;
  }
  auto error = last_line(r.err);
  for (auto forbidden : {"PermissionError", "MemoryError", "Errno 13", "Errno 1]", "Read-only file system",
                         "File too large", "No space left on device"})
    if (error.find(forbidden) != std::string::npos)
      return {verdict::sandbox_violation, 0.0f, what + ": stopped by the sandbox: " + error};
  return {verdict::wrong, 0.0f,
          what + ": exited with code " + std::to_string(r.exit_code) + (error.empty() ? "" : ": " + error)};
}

// The sandbox policy with the interpreter's installation visible: a python
// outside the policy's read-only directories (e.g. /opt/python/bin/python3)
// brings its prefix (/opt/python).
sandbox_policy policy_for(const code_options& options) {
  auto policy = options.policy;
  auto covered = std::any_of(policy.read_only_dirs.begin(), policy.read_only_dirs.end(), [&](const std::string& dir) {
    return options.python.compare(0, dir.size(), dir) == 0 && options.python.size() > dir.size() &&
           options.python[dir.size()] == '/';
  });
  if (!covered) {
    auto prefix = std::filesystem::path{options.python}.parent_path().parent_path();
    if (prefix.has_relative_path())
      policy.read_only_dirs.push_back(prefix.string());
  }
  return policy;
}

}  // namespace

std::optional<std::string> extract_code(std::string_view response) {
  auto close = response.rfind("```");
  if (close == std::string_view::npos || close == 0)
    return std::nullopt;
  auto open = response.rfind("```", close - 1);
  if (open == std::string_view::npos)
    return std::nullopt;
  auto body_start = response.find('\n', open);
  if (body_start == std::string_view::npos || body_start > close)
    return std::nullopt;
  auto language = response.substr(open + 3, body_start - open - 3);
  if (!(language.empty() || language == "python" || language == "py" || language == "python3"))
    return std::nullopt;
  auto code = std::string{response.substr(body_start + 1, close - body_start - 1)};
  if (code.find_first_not_of(" \t\r\n") == std::string::npos)
    return std::nullopt;
  return code;
}

std::string interpreter_problem(const std::string& python) {
  std::error_code ec;
  if (!std::filesystem::exists(python, ec))
    return "no such file";
  if (!std::filesystem::is_regular_file(python, ec))
    return "not a file";
  if (::access(python.c_str(), X_OK) != 0)
    return "not executable";
  return {};
}

verification verify_code(std::string_view response, const code_task& task, const code_options& options,
                         const std::atomic<bool>* cancel) {
  auto code = extract_code(response);
  if (!code)
    return {verdict::no_answer, 0.0f, "no fenced ```python code block found"};
  size_t total = task.io_cases.size() + task.assertions.size();
  if (total == 0)
    return {verdict::error, 0.0f, "the task has no tests"};
  auto started = std::chrono::steady_clock::now();
  auto time_left = [&] {
    return task.total_time_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  const auto policy = policy_for(options);
  std::vector<std::string> notes;
  size_t passed = 0;
  std::optional<verification> first_failure;
  auto run = [&](sandbox_request request, double wall_s) {
    request.limits = options.limits;
    request.limits.wall_s = std::min(wall_s, std::max(0.05, time_left()));
    request.limits.cpu_s = request.limits.wall_s;
    auto result = run_sandboxed(request, policy);
    for (auto& n : result.notes)
      if (std::find(notes.begin(), notes.end(), n) == notes.end())
        notes.push_back(n);
    return result;
  };
  auto stopped = [&]() -> std::optional<verification> {
    if (cancel && cancel->load())
      return verification{verdict::timeout, 0.0f, "verification cancelled (pool deadline)"};
    if (time_left() <= 0)
      return verification{verdict::timeout, 0.0f,
                          "total time limit of " + fmt::format("{:g}", task.total_time_s) + " s exceeded"};
    return std::nullopt;
  };

  for (size_t i = 0; i < task.io_cases.size(); ++i) {
    if (auto stop = stopped()) {
      first_failure = first_failure ? first_failure : stop;
      break;
    }
    auto result =
        run({{options.python, "-I", "main.py"}, {{"main.py", *code}}, task.io_cases[i].input, {}, std::nullopt},
            task.case_time_s);
    auto what = "case " + std::to_string(i);
    if (result.outcome == sandbox_outcome::exited && result.exit_code == 0) {
      if (normalize_output(result.out) == normalize_output(task.io_cases[i].expected_output)) {
        ++passed;
        continue;
      }
      if (!first_failure)
        first_failure = verification{verdict::wrong, 0.0f, what + ": output differs from the expected output"};
    } else if (!first_failure) {
      first_failure = judge_failure(result, what);
    }
    if (!task.partial_credit)
      break;
  }

  bool violated = false;
  if (!task.assertions.empty() && (task.partial_credit || !first_failure)) {
    if (auto stop = stopped()) {
      first_failure = first_failure ? first_failure : stop;
    } else {
      std::random_device device;
      std::string marker = "AREAL" + std::to_string(device()) + std::to_string(device());
      sandbox_request request{{options.python, "-I", "judge.py"},
                              {{"judge.py", harness::judge_source()}},
                              harness::judge_input(marker, task),
                              {},
                              sandbox_companion{{options.python, "-I", "runner.py"},
                                                {{"runner.py", harness::runner_source()}, {"solution.py", *code}}}};
      // One judge runs every assertion: give it the time of that many cases.
      auto result = run(std::move(request), task.case_time_s * static_cast<double>(task.assertions.size()));
      auto report = harness::read_report(result.out, marker, task.assertions.size());
      if (!report.setup_error.empty())
        return {verdict::error, 0.0f, "the task's test setup failed: " + report.setup_error};
      violated = !report.violation.empty();
      passed += report.passed();
      if (violated) {
        first_failure = verification{verdict::wrong, 0.0f, report.violation};
      } else if (report.passed() < task.assertions.size() && !first_failure) {
        if (!report.load_error.empty())
          first_failure = verification{verdict::wrong, 0.0f, "the program failed while loading: " + report.load_error};
        else if (!report.first_failure.empty())
          first_failure = verification{verdict::wrong, 0.0f, report.first_failure};
        else
          first_failure = judge_failure(result, "assertions");
      }
    }
  }

  std::string suffix;
  for (auto& n : notes)
    suffix += "; " + n;
  auto tally = std::to_string(passed) + "/" + std::to_string(total) + " tests passed";
  if (passed == total && !violated)
    return {verdict::correct, 1.0f, tally + suffix};
  auto failure = first_failure.value_or(verification{verdict::wrong, 0.0f, "tests failed"});
  // A program that broke the harness's protocol earns nothing, partial credit or not.
  failure.reward = task.partial_credit && !violated ? static_cast<float>(passed) / static_cast<float>(total) : 0.0f;
  failure.detail = tally + "; " + failure.detail + suffix;
  return failure;
}

}  // namespace areal::reward
