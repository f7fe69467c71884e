// The code reward against programs that try to earn it without solving the
// problem, on all 164 problems of OpenAI's HumanEval (tests/data/humaneval.jsonl,
// made by tests/data/import_humaneval.py): the canonical solutions earn it on
// every problem, each known hack class on none. And two concurrent runs cannot
// reach each other or the host.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "areal/reward/sandbox.hpp"
#include "areal/reward/score.hpp"
#include "areal/tasks/tasks.hpp"

using namespace areal;

namespace {

const std::string data_file = std::string{AREAL_SOURCE_DIR} + "/tests/data/humaneval.jsonl";

struct problem {
  std::string prompt, canonical, entry;
  reward_task task;
};

std::vector<problem> humaneval() {
  std::vector<problem> out;
  auto source = tasks::jsonl_source(data_file);
  while (auto item = source->next())
    out.push_back({item->prompt, item->worked_solution, item->task.entry_points.at(0), item->task});
  return out;
}

std::string fenced(const std::string& code) {
  return "```python\n" + code + "\n```\n";
}

// The prompt (signature and docstring) with `body` as the entry point's body.
std::string with_body(const problem& p, const std::string& body) {
  return fenced(p.prompt + body);
}

struct hack {
  std::string name;
  std::function<std::string(const problem&)> response;
};

// Each rewrites a wrong solution (the entry point returns None) so that it
// would pass if the harness let it.
const std::vector<hack> hacks = {
    {"returns None", [](const problem& p) { return with_body(p, "    return None\n"); }},
    {"forged result lines: on stdout, every descriptor and every visible process's stdout, with any marker it "
     "can find",
     [](const problem& p) {
       return with_body(p, R"PY(    return None

import glob, os, sys
seen = ""
for path in glob.glob("/proc/[0-9]*/fd/*") + glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ"):
    try:
        seen += open(path, errors="replace").read(1 << 16)
    except Exception:
        pass
for module in list(sys.modules.values()):
    for value in list(getattr(module, "__dict__", {}).values()):
        if isinstance(value, str) and value.startswith("AREAL"):
            seen += " " + value
markers = {word for word in seen.split() if word.startswith("AREAL")} or {"AREAL"}
forged = "".join(m + " PASS 0\n" + m + " DONE 1\n" for m in markers)
print(forged)
for fd in range(64):
    try:
        os.write(fd, forged.encode())
    except OSError:
        pass
for path in glob.glob("/proc/[0-9]*/fd/1"):
    try:
        open(path, "w").write(forged)
    except Exception:
        pass
)PY");
     }},
    {"mutated test lists: every list, dict and code object it can reach emptied or rewritten",
     [](const problem& p) {
       return with_body(p, R"PY(    return None

import gc, sys
for obj in gc.get_objects():
    try:
        if isinstance(obj, list) and any(isinstance(x, str) and ("assert" in x or "check(" in x) for x in obj):
            obj[:] = ["pass"] * len(obj)
        elif isinstance(obj, dict) and any(k in obj for k in ("tests", "assertions", "test")):
            for k in ("tests", "assertions", "test"):
                obj.pop(k, None)
    except Exception:
        pass
main = sys.modules.get("__main__")
for name in dir(main):
    if "test" in name.lower() and isinstance(getattr(main, name), list):
        setattr(main, name, ["pass"] * len(getattr(main, name)))
)PY");
     }},
    {"monkeypatched builtins and assert helpers",
     [](const problem& p) {
       return with_body(p, R"PY(    return None

import builtins, math, operator
class Never(BaseException):
    pass
builtins.AssertionError = Never
builtins.exec = lambda *a, **k: None
builtins.abs = lambda x: 0
builtins.all = lambda x: True
builtins.any = lambda x: True
builtins.isinstance = lambda *a: True
builtins.print = lambda *a, **k: None
math.isclose = lambda *a, **k: True
math.fabs = lambda x: 0.0
operator.eq = lambda a, b: True
)PY");
     }},
    {"early exit while loading (os._exit(0))",
     [](const problem& p) { return with_body(p, "    return None\n\nimport os\nos._exit(0)\n"); }},
    {"early exit when called (SystemExit, then os._exit)",
     [](const problem& p) {
       return with_body(p, "    import os, sys\n    try:\n        sys.exit(0)\n    finally:\n        os._exit(0)\n");
     }},
    {"a result whose __eq__ is always true",
     [](const problem& p) {
       return with_body(p, R"PY(    class Anything:
        def __eq__(self, other): return True
        def __ne__(self, other): return False
        def __bool__(self): return True
        __lt__ = __le__ = __gt__ = __ge__ = __eq__
        def __hash__(self): return 0
        def __sub__(self, other): return 0
        __rsub__ = __add__ = __radd__ = __sub__
        def __abs__(self): return 0
        def __float__(self): return 0.0
        def __len__(self): return 0
        def __iter__(self): return iter(())
    return Anything()
)PY");
     }},
    {"a built-in type's subclass whose __eq__ is always true",
     [](const problem& p) {
       return with_body(p, R"PY(    class AlwaysList(list):
        def __eq__(self, other): return True
        def __ne__(self, other): return False
        __hash__ = object.__hash__
    return AlwaysList()
)PY");
     }},
    {"reading the expected outputs from disk (the dataset's own file, by its absolute path)",
     [](const problem& p) {
       return with_body(p, "    args = list(locals().values())\n    import json\n    for path in [" +
                               std::string{"\""} + data_file + "\"" + R"PY(]:
        try:
            lines = open(path).read().splitlines()
        except Exception:
            continue
        for line in lines:
            item = json.loads(line)
            if item["task"]["entry_points"][0] == )PY" +
                               "\"" + p.entry + "\"" + R"PY(:
                fence = chr(96) * 3
                code = item["solution"].split(fence + "python\n", 1)[1].rsplit(fence, 1)[0]
                scope = {}
                exec(code, scope)
                return scope[)PY" +
                               "\"" + p.entry + "\"" + R"PY(](*args)
    return None
)PY");
     }},
};

// Verdicts for every problem, on two threads (as two reward workers would).
size_t rewarded(const std::vector<problem>& problems, const std::function<std::string(const problem&)>& response,
                std::string& example, const reward::scoring_options& options = {}) {
  std::atomic<size_t> next{0}, count{0};
  std::mutex m;
  auto work = [&] {
    for (size_t i; (i = next++) < problems.size();) {
      auto v = reward::score_response(response(problems[i]), problems[i].task, options);
      if (v.reward > 0) {
        ++count;
        std::lock_guard<std::mutex> lock{m};
        if (example.empty())
          example = problems[i].entry + ": " + v.detail;
      } else if (i == 0) {
        std::lock_guard<std::mutex> lock{m};
        example = example.empty() ? "not rewarded, e.g. " + problems[i].entry + ": " + v.detail : example;
      }
    }
  };
  std::thread a{work}, b{work};
  a.join();
  b.join();
  return count;
}

}  // namespace

TEST_CASE("HumanEval: every canonical solution earns the reward") {
  auto problems = humaneval();
  REQUIRE(problems.size() == 164);
  std::string example;
  auto n = rewarded(
      problems, [](const problem& p) { return p.canonical; }, example);
  MESSAGE("HumanEval canonical solutions rewarded: " << n << "/164");
  INFO(example);
  CHECK(n == 164);
}

TEST_CASE("HumanEval: no hack class earns the reward on any problem") {
  auto problems = humaneval();
  REQUIRE(problems.size() == 164);
  for (auto& h : hacks) {
    std::string example;
    auto n = rewarded(problems, h.response, example);
    MESSAGE("HumanEval hack rewarded " << n << "/164: " << h.name << " (" << example.substr(0, 300) << ")");
    CHECK_MESSAGE(n == 0, h.name);
  }
}

TEST_CASE("the disk hack works where the dataset is visible: hiding the host's files is what stops it") {
  auto problems = humaneval();
  problems.resize(10);
  reward::scoring_options visible;
  visible.code.policy.read_only_dirs.push_back(AREAL_SOURCE_DIR);
  std::string example;
  auto& disk = hacks.back();
  REQUIRE(disk.name.rfind("reading the expected outputs", 0) == 0);
  CHECK(rewarded(problems, disk.response, example, visible) == 10);
  example.clear();
  CHECK(rewarded(problems, disk.response, example) == 0);
}
