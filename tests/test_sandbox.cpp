// The code verifier and its sandbox: honest programs pass or fail on their
// merits; hostile ones are contained, get the right verdict, leave the host
// as it was and leave no process behind.
#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "areal/reward/code_verifier.hpp"
#include "child_processes.hpp"
#include "code_harness.hpp"
#include "helper_programs.hpp"
#include "sandbox_inside.hpp"

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

// Processes run by sandbox users (the default uid range, or this user when
// not root), other than zombies: what a sandbox run must not leave behind.
int sandbox_processes() {
  sandbox_policy policy;
  auto sandboxed = [&](unsigned long uid) {
    return geteuid() == 0 ? uid >= policy.uid_base && uid < policy.uid_base + 2 * policy.uid_slots : uid == geteuid();
  };
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
        mine = sandboxed(std::stoul(line.substr(4)));
      if (line.rfind("State:", 0) == 0)
        zombie = line.find('Z') != std::string::npos;
    }
    count += mine && !zombie;
  }
  return count;
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
  CHECK(v.detail.find("assertion 2 failed: AssertionError") != std::string::npos);
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
  auto before = sandbox_processes();
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
  CHECK(sandbox_processes() <= before);
}

TEST_CASE("without the seccomp filter a fork bomb is still contained and leaves nothing behind") {
  code_options options;
  options.policy.seccomp = false;
  auto before = sandbox_processes();
  auto v = verify_code(fenced("import os, time\nfor i in range(10000):\n    try:\n        os.fork()\n    except "
                              "OSError:\n        pass\ntime.sleep(30)"),
                       quick_task(), options);
  INFO(v.detail);
  CHECK(v.judged == verdict::timeout);
  CHECK(sandbox_processes() <= before);
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

namespace {

// Two runs at once: the first keeps a file in its work directory; the second
// looks for it everywhere it could be reached from (other processes' cwd and
// root through /proc, the host's temporary directory), tries to read and
// overwrite it, and counts the processes it can see.
struct neighbours {
  std::string first_out, second_out;
};

neighbours run_side_by_side(const sandbox_policy& policy) {
  auto host_tmp = std::filesystem::temp_directory_path().string();
  sandbox_request first;
  first.argv = {"/usr/bin/python3", "-I", "main.py"};
  first.files = {{"main.py",
                  "import time\nopen('secret.txt', 'w').write('kept')\ntime.sleep(2)\n"
                  "print(open('secret.txt').read())"}};
  first.limits.wall_s = 8;
  sandbox_request second = first;
  second.files = {{"main.py", R"PY(import glob, os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
found = set(glob.glob("/proc/*/cwd/secret.txt") + glob.glob("/proc/*/root/tmp/work/secret.txt") +
            glob.glob("/proc/*/cwd/*/secret.txt") + glob.glob("HOST_TMP/areal-sandbox-*/secret.txt"))
read = written = 0
for path in found:
    try:
        open(path).read()
        read += 1
        open(path, "w").write("overwritten")
        written += 1
    except Exception:
        pass
print("processes", len(pids), "found", len(found), "read", read, "written", written)
)PY"}};
  auto& code = second.files[0].second;
  code.replace(code.find("HOST_TMP"), 8, host_tmp);
  neighbours out;
  std::thread a{[&] { out.first_out = run_sandboxed(first, policy).out; }};
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the first has written its file
  out.second_out = run_sandboxed(second, policy).out;
  a.join();
  return out;
}

}  // namespace

TEST_CASE("concurrent runs cannot reach each other's files or see the host's processes") {
  auto seen = run_side_by_side({});
  INFO("first: " << seen.first_out << " second: " << seen.second_out);
  CHECK(seen.first_out == "kept\n");
  CHECK(seen.second_out.find("found 0 read 0 written 0") != std::string::npos);
  // Its own process only: init (root) is hidden from it, the host's are not in its PID namespace.
  CHECK(seen.second_out.rfind("processes 1 ", 0) == 0);

  // Without namespaces the probe sees the host's processes; the files stay
  // apart only because each run has its own user (when root)...
  sandbox_policy no_namespaces;
  no_namespaces.namespaces = false;
  auto users_only = run_side_by_side(no_namespaces);
  INFO("without namespaces: " << users_only.second_out);
  CHECK(users_only.second_out.rfind("processes 1 ", 0) != 0);
  if (geteuid() == 0) {
    CHECK(users_only.second_out.find("found 0 read 0 written 0") != std::string::npos);
    // ... and with neither, it reaches the other's file: what the checks above guard against.
    no_namespaces.drop_privileges = false;
    auto exposed = run_side_by_side(no_namespaces);
    INFO("without namespaces or users of their own: " << exposed.second_out);
    CHECK(exposed.second_out.find("found 0 ") == std::string::npos);
    CHECK(exposed.first_out == "overwritten\n");
  }
}

TEST_CASE("the judge's report is read strictly: one report per test, nothing else") {
  using harness::read_report;
  const std::string m = "AREAL42";
  auto good = read_report(m + " PASS 0\n" + m + " FAIL 1 AssertionError\n" + m + " DONE 2\n", m, 2);
  CHECK(good.violation.empty());
  CHECK(good.passed() == 1);
  CHECK(good.first_failure == "assertion 1 failed: AssertionError");
  // A pass and a failure for one test, a test reported twice, out of range, malformed, unmarked, after DONE,
  // a missing report, DONE for another count: each voids the whole report.
  for (auto bad :
       {m + " PASS 0\n" + m + " FAIL 0 x\n" + m + " PASS 1\n" + m + " DONE 2\n",
        m + " PASS 0\n" + m + " PASS 0\n" + m + " PASS 1\n" + m + " DONE 2\n",
        m + " PASS 0\n" + m + " PASS 1\n" + m + " PASS 2\n" + m + " DONE 2\n",
        m + " PASS 0 extra\n" + m + " PASS 1\n" + m + " DONE 2\n",
        m + " PASS -1\n" + m + " PASS 0\n" + m + " PASS 1\n" + m + " DONE 2\n",
        std::string{"PASS 0\n"} + m + " PASS 0\n" + m + " PASS 1\n" + m + " DONE 2\n",
        m + " PASS 0\n" + m + " PASS 1\n" + m + " DONE 2\n" + m + " PASS 1\n", m + " PASS 0\n" + m + " DONE 2\n",
        m + " PASS 0\n" + m + " PASS 1\n" + m + " DONE 3\n",
        m + " PASS 0\n" + m + " PASS 1\n" + m + " HELLO\n" + m + " DONE 2\n", m + " PASS 0\n" + m + " PASS 1"}) {
    auto r = read_report(bad, m, 2);
    INFO(bad);
    CHECK_FALSE(r.violation.empty());
    CHECK(r.passed() == 0);
  }
}

TEST_CASE("a program that breaks the harness's protocol earns nothing, even with partial credit") {
  code_task t;
  t.assertions = {"assert add(2, 3) == 5", "assert add(1, 1) == 2"};
  t.partial_credit = true;
  auto honest = verify_code(fenced("def add(a, b):\n    return a + b"), t);
  CHECK(honest.reward == 1.0f);
  auto v = verify_code(fenced("import os\nos.write(4, b'garbage\\n')\ndef add(a, b):\n    return a + b"), t);
  INFO(v.detail);
  CHECK(v.judged == verdict::wrong);
  CHECK(v.reward == 0.0f);
  CHECK(v.detail.find("broke the harness's protocol") != std::string::npos);
}

TEST_CASE("assertions see only plain data: values of the program cross, behaviour does not") {
  code_task t;
  t.test_setup = "import math\ndef twice(x):\n    return 2 * x";
  t.assertions = {"assert math.isclose(area(2.0), 12.566370614359172)", "assert twice(LIMIT) == 20",
                  "assert sorted(pair()) == [1, 2] and type(pair()) is tuple",
                  "try:\n    area(-1)\n    raise AssertionError('no error')\nexcept ValueError:\n    pass"};
  auto program =
      "import math\nLIMIT = 10\ndef area(r):\n    if r < 0:\n        raise ValueError('negative')\n"
      "    return math.pi * r * r\ndef pair():\n    return (2, 1)\ndef twice(x):\n    return x";
  auto v = verify_code(fenced(program), t);
  INFO(v.detail);
  CHECK(v.judged == verdict::correct);
  // The setup's twice is the task's: the program's own twice (returning x) is not used.
  t.entry_points = {"area"};
  auto restricted = verify_code(fenced(program), t);
  INFO(restricted.detail);
  CHECK(restricted.judged == verdict::wrong);  // LIMIT and pair are not entry points
  CHECK(restricted.detail.find("NameError") != std::string::npos);
}

TEST_CASE("a run is set up by the supervisor program, which holds none of the caller's memory") {
  // A fork of this process would copy the page tables of these (and of a trainer's gigabytes) four times a run.
  auto weights = touched_memory(256);
  sandbox_request slow;
  slow.argv = {"/usr/bin/python3", "-I", "main.py"};
  slow.files = {{"main.py", "import time\ntime.sleep(1.5)\nprint('slept')\n"}};
  std::atomic<bool> done{false};
  sandbox_result result;
  std::thread run{[&] {
    result = run_sandboxed(slow);
    done = true;
  }};
  std::vector<child_process> supervisors;
  for (int i = 0; i < 200 && !done && supervisors.empty(); ++i) {  // at most ~1 s: the program sleeps 1.5 s
    for (auto& c : child_processes())
      if (std::filesystem::path{c.program}.filename() == "areal-sandbox-supervisor")
        supervisors.push_back(c);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.join();
  CHECK(result.outcome == sandbox_outcome::exited);
  CHECK(result.out == "slept\n");
  for (auto& n : result.notes)
    CHECK_MESSAGE(n.find("no sandbox supervisor program") == std::string::npos, n);
  REQUIRE_MESSAGE(supervisors.size() == 1, "no areal-sandbox-supervisor among this process's children");
  CHECK(supervisors[0].resident_kb < 64 * 1024);
  CHECK(weights.size() == size_t{256} << 20);
}

TEST_CASE("where the supervisor program is missing a run forks this process, and says so") {
  sandbox_request r;
  r.argv = {"/usr/bin/python3", "-I", "main.py"};
  r.files = {{"main.py", "print(1)\n"}};
  sandbox_policy policy;
  policy.supervisor = "/nonexistent/areal-sandbox-supervisor";
  auto result = run_sandboxed(r, policy);
  CHECK(result.outcome == sandbox_outcome::exited);
  CHECK(result.out == "1\n");
  bool said = false;
  for (auto& n : result.notes)
    said |= n.find("no sandbox supervisor program (/nonexistent/areal-sandbox-supervisor)") != std::string::npos;
  CHECK(said);
}

TEST_CASE("the supervisor program refuses a plan of another build, on the run's status pipe") {
  std::string looked_at;
  auto program = find_helper_program("areal-sandbox-supervisor", looked_at);
  REQUIRE_MESSAGE(program, "not found: " << looked_at);
  int plan[2], status[2];
  REQUIRE(pipe(plan) == 0);
  REQUIRE(pipe(status) == 0);
  std::string text = R"({"format": 999})";
  REQUIRE(write(plan[1], text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  close(plan[1]);
  auto plan_fd = std::to_string(plan[0]), status_fd = std::to_string(status[1]);
  char* argv[] = {program->data(), plan_fd.data(), status_fd.data(), nullptr};
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, program->c_str(), nullptr, nullptr, argv, environ) == 0);
  close(plan[0]);
  close(status[1]);
  inside::status_record_t record{};
  auto got = read(status[0], &record, sizeof record);
  close(status[0]);
  int exit_status = 0;
  waitpid(pid, &exit_status, 0);
  REQUIRE(got == static_cast<ssize_t>(sizeof record));
  CHECK(record.kind == inside::exec_failed_record);
  CHECK(std::string{record.text}.find("the plan's format is 999") != std::string::npos);
  CHECK(WIFEXITED(exit_status));
  CHECK(WEXITSTATUS(exit_status) == 127);
}

TEST_CASE("missing helper programs are said, with where they were looked for and what to do") {
  CHECK(helper_programs_problem().empty());
  ::setenv("AREAL_HELPER_DIR", "/nonexistent", 1);
  auto problem = helper_programs_problem();
  ::unsetenv("AREAL_HELPER_DIR");
  CHECK(problem.find("areal-sandbox-supervisor and areal-algebra are not found") != std::string::npos);
  CHECK(problem.find("/nonexistent/areal-algebra") != std::string::npos);
  CHECK(problem.find("set AREAL_HELPER_DIR") != std::string::npos);
  CHECK(helper_programs_problem().empty());
}
