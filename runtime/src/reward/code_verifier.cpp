// The code verifier: a program run against its tests in the sandbox, and the verdict (see code_verifier.hpp).
#include "areal/reward/code_verifier.hpp"

#include <algorithm>
#include <chrono>
#include <random>

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

std::string hex(std::string_view s) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// Reads the assertions (hex lines) and a per-run nonce from stdin before the
// program's code runs, so that the program cannot print results of its own.
constexpr const char* harness = R"PY(import sys
_areal_nonce = sys.stdin.readline().strip()
_areal_tests = [bytes.fromhex(line.strip()).decode() for line in sys.stdin if line.strip()]
_areal_print = print
_areal_out = sys.stdout
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), globals())
except BaseException as e:
    _areal_out.write(_areal_nonce + " LOAD " + type(e).__name__ + ": " + str(e)[:200].replace("\n", " ") + "\n")
    _areal_out.flush()
    raise SystemExit(0)
for _areal_i, _areal_test in enumerate(_areal_tests):
    try:
        exec(_areal_test, globals())
        _areal_out.write(_areal_nonce + " PASS " + str(_areal_i) + "\n")
    except BaseException as e:
        _areal_out.write(_areal_nonce + " FAIL " + str(_areal_i) + " " + type(e).__name__ + "\n")
    _areal_out.flush()
)PY";

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
  std::vector<std::string> notes;
  size_t passed = 0;
  std::optional<verification> first_failure;
  auto run = [&](sandbox_request request) {
    request.limits = options.limits;
    request.limits.wall_s = std::min(task.case_time_s, std::max(0.05, time_left()));
    request.limits.cpu_s = request.limits.wall_s;
    auto result = run_sandboxed(request, options.policy);
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
                          "total time limit of " + std::to_string(task.total_time_s) + " s exceeded"};
    return std::nullopt;
  };

  for (size_t i = 0; i < task.io_cases.size(); ++i) {
    if (auto stop = stopped()) {
      first_failure = first_failure ? first_failure : stop;
      break;
    }
    auto result = run({{options.python, "-I", "main.py"}, {{"main.py", *code}}, task.io_cases[i].input, {}});
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

  if (!task.assertions.empty() && (task.partial_credit || !first_failure)) {
    if (auto stop = stopped()) {
      first_failure = first_failure ? first_failure : stop;
    } else {
      std::random_device device;
      std::string nonce = "AREAL" + std::to_string(device()) + std::to_string(device());
      std::string input = nonce + "\n";
      for (auto& a : task.assertions)
        input += hex(a) + "\n";
      sandbox_request request{
          {options.python, "-I", "harness.py"}, {{"harness.py", harness}, {"solution.py", *code}}, input, {}};
      // One process runs every assertion: give it the time of that many cases.
      request.limits = options.limits;
      request.limits.wall_s =
          std::min(task.case_time_s * static_cast<double>(task.assertions.size()), std::max(0.05, time_left()));
      request.limits.cpu_s = request.limits.wall_s;
      auto result = run_sandboxed(request, options.policy);
      for (auto& n : result.notes)
        if (std::find(notes.begin(), notes.end(), n) == notes.end())
          notes.push_back(n);
      size_t assertion_passed = 0;
      std::string load_error, first_failed;
      size_t pos = 0;
      auto marker = nonce + " ";
      while ((pos = result.out.find(marker, pos)) != std::string::npos) {
        if (pos != 0 && result.out[pos - 1] != '\n') {
          pos += marker.size();
          continue;
        }
        auto end = result.out.find('\n', pos);
        auto line = result.out.substr(pos + marker.size(),
                                      end == std::string::npos ? std::string::npos : end - pos - marker.size());
        if (line.rfind("PASS ", 0) == 0)
          ++assertion_passed;
        else if (line.rfind("FAIL ", 0) == 0 && first_failed.empty())
          first_failed = line.substr(5);
        else if (line.rfind("LOAD ", 0) == 0)
          load_error = line.substr(5);
        pos = end == std::string::npos ? result.out.size() : end;
      }
      assertion_passed = std::min(assertion_passed, task.assertions.size());
      passed += assertion_passed;
      if (assertion_passed < task.assertions.size() && !first_failure) {
        if (!load_error.empty())
          first_failure = verification{verdict::wrong, 0.0f, "the program failed while loading: " + load_error};
        else if (!first_failed.empty())
          first_failure = verification{verdict::wrong, 0.0f, "assertion " + first_failed + " failed"};
        else if (result.outcome == sandbox_outcome::exited && result.exit_code == 0)
          first_failure = verification{verdict::wrong, 0.0f, "the program ended the process before all assertions ran"};
        else
          first_failure = judge_failure(result, "assertions");
      }
    }
  }

  std::string suffix;
  for (auto& n : notes)
    suffix += "; " + n;
  auto tally = std::to_string(passed) + "/" + std::to_string(total) + " tests passed";
  if (passed == total)
    return {verdict::correct, 1.0f, tally + suffix};
  auto failure = first_failure.value_or(verification{verdict::wrong, 0.0f, "tests failed"});
  failure.reward = task.partial_credit ? static_cast<float>(passed) / static_cast<float>(total) : 0.0f;
  failure.detail = tally + "; " + failure.detail + suffix;
  return failure;
}

}  // namespace areal::reward
