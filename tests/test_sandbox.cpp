// The code verifier and its sandbox: honest programs pass or fail on their
// merits; hostile ones are contained, get the right verdict, leave the host
// as it was and leave no process behind.
#include <doctest/doctest.h>

#include <dirent.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "areal/reward/code_verifier.hpp"

using namespace areal;
using namespace areal::reward;

namespace {

std::string fenced(const std::string& code) {
  return "Here is my solution:\n```python\n" + code + "\n```\n";
}

code_task echo_task() {
  code_task t;
  t.io_cases = {{"3 4\n", "7\n"}, {"10 -2\n", "8"}};
  t.case_time_s = 5;
  t.total_time_s = 20;
  return t;
}

code_task quick_task() {
  code_task t;
  t.io_cases = {{"", "done\n"}};
  t.case_time_s = 1.5;
  t.total_time_s = 5;
  return t;
}

// Processes of a user, other than zombies: what a sandbox run must not leave behind.
int processes_of(uid_t uid) {
  int count = 0;
  for (auto& entry : std::filesystem::directory_iterator("/proc")) {
    auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream status(entry.path() / "status");
    std::string line;
    bool mine = false, zombie = false;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) == 0)
        mine = std::stoul(line.substr(4)) == uid;
      if (line.rfind("State:", 0) == 0)
        zombie = line.find('Z') != std::string::npos;
    }
    count += mine && !zombie;
  }
  return count;
}

uid_t sandbox_uid() {
  return geteuid() == 0 ? 65534 : geteuid();
}

struct hostile {
  const char* name;
  std::string code;
  verdict expected;
};

}  // namespace

TEST_CASE("an honest program passes stdin and stdout cases") {
  auto v = verify_code(fenced("a, b = map(int, input().split())\nprint(a + b)"), echo_task());
  INFO(v.detail);
  CHECK(v.judged == verdict::correct);
  CHECK(v.reward == 1.0f);
  CHECK(v.detail.find("2/2 tests passed") != std::string::npos);
}

TEST_CASE("wrong output and exceptions are wrong answers") {
  auto v = verify_code(fenced("a, b = map(int, input().split())\nprint(a * b)"), echo_task());
  CHECK(v.judged == verdict::wrong);
  CHECK(v.detail.find("case 0: output differs") != std::string::npos);
  v = verify_code(fenced("print(1 // 0)"), echo_task());
  CHECK(v.judged == verdict::wrong);
  CHECK(v.detail.find("ZeroDivisionError") != std::string::npos);
}

TEST_CASE("assertion tests run against the program's functions with partial credit as an option") {
  code_task t;
  t.assertions = {"assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"};
  auto v = verify_code(fenced("def add(a, b):\n    return a + b"), t);
  INFO(v.detail);
  CHECK(v.judged == verdict::wrong);
  CHECK(v.reward == 0.0f);
  CHECK(v.detail.find("2/3 tests passed") != std::string::npos);
  CHECK(v.detail.find("assertion 2 AssertionError failed") != std::string::npos);
  t.partial_credit = true;
  v = verify_code(fenced("def add(a, b):\n    return a + b"), t);
  CHECK(v.reward == doctest::Approx(2.0 / 3.0));
  t.assertions.pop_back();
  t.partial_credit = false;
  CHECK(verify_code(fenced("def add(a, b):\n    return a + b"), t).judged == verdict::correct);
}

TEST_CASE("a program cannot fake assertion results") {
  code_task t;
  t.assertions = {"assert solve() == 1"};
  auto forged = "import sys\nfor i in range(5):\n    print('AREAL' + str(i) + ' PASS 0')\ndef solve():\n    return 0";
  auto v = verify_code(fenced(forged), t);
  CHECK(v.judged == verdict::wrong);
}

TEST_CASE("a response without a code block has no answer") {
  CHECK(verify_code("I would use a loop.", echo_task()).judged == verdict::no_answer);
  CHECK(verify_code("```rust\nfn main() {}\n```", echo_task()).judged == verdict::no_answer);
}

TEST_CASE("hostile programs are contained with the right verdict") {
  auto marker = std::filesystem::path{"/tmp/areal-escape-" + std::to_string(getpid())};
  auto before = processes_of(sandbox_uid());
  const std::vector<hostile> programs = {
      {"infinite loop", "while True:\n    pass", verdict::timeout},
      {"fork bomb", "import os\nwhile True:\n    os.fork()", verdict::sandbox_violation},
      {"memory bomb", "x = bytearray(1 << 40)", verdict::sandbox_violation},
      {"gigabytes of output", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", verdict::sandbox_violation},
      {"writing outside the work directory",
       "open('" + marker.string() + "', 'w').write('x')\nopen('/etc/areal-escape', 'w').write('x')",
       verdict::sandbox_violation},
      {"opening a network connection", "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
       verdict::sandbox_violation},
      {"sleeping past the deadline", "import time\ntime.sleep(30)", verdict::timeout},
      {"killing its parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)",
       verdict::sandbox_violation},
      {"a huge file", "open('big', 'wb').write(b'x' * (64 << 20))", verdict::sandbox_violation},
  };
  if (geteuid() == 0) {
    CHECK(verify_code(fenced("print(open('/etc/shadow').read())"), quick_task()).judged == verdict::sandbox_violation);
  }
  for (auto& p : programs) {
    auto v = verify_code(fenced(p.code), quick_task());
    INFO(std::string{p.name} << ": " << std::string{to_string(v.judged)} << ": " << v.detail);
    CHECK(v.judged == p.expected);
    CHECK(v.reward == 0.0f);
  }
  CHECK_FALSE(std::filesystem::exists(marker));
  CHECK_FALSE(std::filesystem::exists("/etc/areal-escape"));
  CHECK(processes_of(sandbox_uid()) <= before);
}

TEST_CASE("without the seccomp filter a fork bomb is still contained and leaves nothing behind") {
  code_options options;
  options.policy.seccomp = false;
  auto before = processes_of(sandbox_uid());
  auto v = verify_code(fenced("import os, time\nfor i in range(10000):\n    try:\n        os.fork()\n    except "
                              "OSError:\n        pass\ntime.sleep(30)"),
                       quick_task(), options);
  INFO(v.detail);
  CHECK(v.judged == verdict::timeout);
  CHECK(processes_of(sandbox_uid()) <= before);
}

TEST_CASE("the sandbox reports what it ran and what it could not apply") {
  sandbox_request r;
  r.argv = {"/usr/bin/python3", "-I", "main.py"};
  r.files = {{"main.py", "import os, sys\nprint(sys.stdin.read().upper(), os.getcwd(), os.environ.get('SECRET'))"}};
  r.stdin_data = "hello";
  setenv("SECRET", "leaked", 1);
  auto result = run_sandboxed(r);
  unsetenv("SECRET");
  CHECK(result.outcome == sandbox_outcome::exited);
  CHECK(result.exit_code == 0);
  CHECK(result.out.find("HELLO") != std::string::npos);
  CHECK(result.out.find("leaked") == std::string::npos);  // scrubbed environment
  CHECK(result.wall_s > 0);
  for (auto& n : result.notes)
    MESSAGE("isolation note: " << n);
  if (geteuid() != 0)
    CHECK_FALSE(result.notes.empty());  // privileges cannot be dropped: it says so

  r.argv = {"relative/python"};
  CHECK(run_sandboxed(r).outcome == sandbox_outcome::start_failed);
  r.argv = {"/nonexistent/python"};
  auto missing = run_sandboxed(r);
  CHECK(missing.outcome == sandbox_outcome::start_failed);
  CHECK(missing.error.find("execve failed") != std::string::npos);
}
