// The assertion harness: the judge's and the solution process's Python, and
// the strict reading of the judge's report (see code_harness.hpp).
#include "code_harness.hpp"

#include <nlohmann/json.hpp>

namespace areal::reward::harness {

namespace {

// Both sides: values as tagged plain data. Subclasses of the built-in types
// travel as their base type's data, so whatever behaviour they add stays behind.
constexpr const char* codec = R"PY(
# The originals, bound here: a program that patches builtins changes only its own module's view.
from builtins import (isinstance, type, format, len, bool, int, float, complex, str, bytes, bytearray, list,
                      tuple, set, frozenset, dict, hasattr, repr, callable, open, BaseException, Exception,
                      ValueError, TypeError, OverflowError, NameError)

class Unencodable(Exception):
    pass

def encode(x, depth=0):
    if depth > 64:
        raise Unencodable("a value nested more than 64 deep")
    if x is None:
        return ["N"]
    if isinstance(x, bool):
        return ["b", bool.__bool__(x)]
    if isinstance(x, int):
        return ["i", format(int.__index__(x), "x")]
    if isinstance(x, float):
        return ["f", float.hex(float.__float__(x))]
    if isinstance(x, complex):
        c = complex.__complex__(x) if hasattr(complex, "__complex__") else complex(x)
        return ["c", float.hex(c.real), float.hex(c.imag)]
    if isinstance(x, str):
        return ["s", str.__str__(x)]
    if isinstance(x, (bytes, bytearray)):
        return ["y", bytes(x).hex()]
    d = depth + 1
    if isinstance(x, list):
        return ["l", [encode(v, d) for v in list.__iter__(x)]]
    if isinstance(x, tuple):
        return ["t", [encode(v, d) for v in tuple.__iter__(x)]]
    if isinstance(x, frozenset):
        return ["F", [encode(v, d) for v in frozenset.__iter__(x)]]
    if isinstance(x, set):
        return ["S", [encode(v, d) for v in set.__iter__(x)]]
    if isinstance(x, dict):
        return ["d", [[encode(k, d), encode(dict.__getitem__(x, k), d)] for k in dict.__iter__(x)]]
    raise Unencodable("a " + type(x).__name__ + " is not plain data")

class Malformed(Exception):
    pass

def decode(v, depth=0):
    if type(v) is not list or not v or type(v[0]) is not str or depth > 64:
        raise Malformed("not a tagged value")
    tag, n = v[0], len(v)
    try:
        if tag == "N" and n == 1:
            return None
        if tag == "b" and n == 2 and type(v[1]) is bool:
            return v[1]
        if tag == "i" and n == 2 and type(v[1]) is str and len(v[1]) <= 100000:
            return int(v[1], 16)
        if tag == "f" and n == 2 and type(v[1]) is str:
            return float.fromhex(v[1])
        if tag == "c" and n == 3 and type(v[1]) is str and type(v[2]) is str:
            return complex(float.fromhex(v[1]), float.fromhex(v[2]))
        if tag == "s" and n == 2 and type(v[1]) is str:
            return v[1]
        if tag == "y" and n == 2 and type(v[1]) is str:
            return bytes.fromhex(v[1])
        if tag in ("l", "t", "S", "F") and n == 2 and type(v[1]) is list:
            items = [decode(item, depth + 1) for item in v[1]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and n == 2 and type(v[1]) is list:
            out = {}
            for pair in v[1]:
                if type(pair) is not list or len(pair) != 2:
                    raise Malformed("a dict entry is not a pair")
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            return out
    except (ValueError, TypeError, OverflowError) as e:
        raise Malformed(str(e)[:100])
    raise Malformed("unknown tag " + repr(tag)[:20])
)PY";

constexpr const char* judge = R"PY(
import builtins, json, os, select, sys, time

class SolutionGone(Exception):
    pass

class SolutionStuck(Exception):
    pass

class Violation(Exception):
    pass

REPLY_LIMIT = 16 << 20

class Link:
    # The pipe pair to the solution's process: one JSON object per line.
    def __init__(self, timeout_s):
        self.timeout_s = timeout_s
        self.buffer = b""
        self.broken = None  # why the link cannot be used any more
        self.violation = None

    def send(self, message):
        data = (json.dumps(message) + "\n").encode()
        try:
            while data:
                data = data[os.write(4, data):]
        except OSError:
            self.broken = "the solution's process ended"
            raise SolutionGone(self.broken)

    def receive(self):
        deadline = time.monotonic() + self.timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([3], [], [], left)[0]:
                self.broken = "the solution did not answer within %g s" % self.timeout_s
                raise SolutionStuck(self.broken)
            chunk = os.read(3, 1 << 16)
            if not chunk:
                self.broken = "the solution's process ended"
                raise SolutionGone(self.broken)
            self.buffer += chunk
            if len(self.buffer) > REPLY_LIMIT:
                self.fail("a reply larger than %d bytes" % REPLY_LIMIT)
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            self.fail("a reply that is not JSON")
        if type(message) is not dict or len(message) != 1:
            self.fail("a reply that is not a one-key object")
        return message

    def fail(self, why):
        self.violation = self.violation or why
        self.broken = why
        raise Violation(why)

    def decoded(self, v):
        try:
            return decode(v)
        except Malformed as e:
            self.fail("a malformed value: " + str(e))

def remote(link, name):
    # Stands in for the solution's function `name`.
    def call(*args, **kwargs):
        if link.broken:
            raise SolutionGone(link.broken)
        try:
            request = {"call": name, "args": encode(list(args)), "kwargs": encode(kwargs)}
        except Unencodable as e:
            raise TypeError("argument cannot be sent to the solution: " + str(e))
        link.send(request)
        reply = link.receive()
        if "value" in reply:
            return link.decoded(reply["value"])
        if "raised" in reply:
            kind, text = reply["raised"] if type(reply["raised"]) is list and len(reply["raised"]) == 2 else ("?", "")
            error = getattr(builtins, kind, None) if type(kind) is str else None
            if not (isinstance(error, type) and issubclass(error, Exception)):
                error = RuntimeError
            raise error(str(text)[:200])
        if "unencodable" in reply:
            raise TypeError("the solution returned " + str(reply["unencodable"])[:100])
        link.fail("a reply of an unknown kind")
    call.__name__ = name
    return call

def one_line(text, limit=200):
    return " ".join(str(text).split())[:limit]

def main():
    try:
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: /proc/<judge> closed to the solution
    except Exception:
        pass
    marker = sys.stdin.readline().strip()
    task = json.loads(sys.stdin.read())
    reports = os.dup(1)
    os.dup2(2, 1)  # what the tests print goes to stderr; stdout carries reports only
    def report(*words):
        os.write(reports, (" ".join([marker] + [str(w) for w in words]) + "\n").encode())
    tests = task["tests"]
    link = Link(task["call_timeout_s"])
    base = {"__name__": "__test__", "__builtins__": builtins}
    try:
        exec(compile(task["setup"], "setup", "exec"), base)
    except BaseException as e:
        report("SETUP", one_line(type(e).__name__ + ": " + str(e)))
        return
    setup_names = set(base)
    try:
        link.send({"go": True})
        hello = link.receive()
        if "load_error" in hello:
            report("LOAD", one_line(hello["load_error"]))
            report("DONE", len(tests))
            return
        if "loaded" not in hello or type(hello["loaded"]) is not dict:
            link.fail("no list of the solution's names")
        wanted = task["entry_points"]
        for name, kind in hello["loaded"].items():
            if wanted and name not in wanted or not wanted and name in setup_names:
                continue
            if kind == ["callable"]:
                base[name] = remote(link, name)
            elif type(kind) is list and len(kind) == 2 and kind[0] == "value":
                base[name] = link.decoded(kind[1])
    except (SolutionGone, SolutionStuck) as e:
        report("LOAD", one_line(e))
        report("DONE", len(tests))
        return
    except Violation as e:
        report("VIOLATION", one_line(e))
        return
    for i, test in enumerate(tests):
        if link.broken and not link.violation:
            report("FAIL", i, one_line(link.broken))
            continue
        try:
            exec(compile(test, "test %d" % i, "exec"), dict(base))
            outcome = None
        except BaseException as e:
            outcome = type(e).__name__ + (": " + str(e) if str(e) else "")
        if link.violation:
            report("VIOLATION", one_line(link.violation))
            return
        if outcome is None:
            report("PASS", i)
        else:
            report("FAIL", i, one_line(outcome))
    report("DONE", len(tests))

main()
)PY";

constexpr const char* runner = R"PY(
import builtins, json, os, sys, types

def main():
    buffer = b""
    # The solution may patch builtins; json (this side's only tool) gets the originals back before each reply.
    originals = dict(builtins.__dict__)
    def send(message):
        builtins.__dict__.update(originals)
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(4, data):]
    def receive():
        nonlocal buffer
        while b"\n" not in buffer:
            chunk = os.read(3, 1 << 16)
            if not chunk:
                return None
            buffer += chunk
        line, _, buffer = buffer.partition(b"\n")
        return json.loads(line)
    if receive() is None:  # the judge's go: it has closed itself to inspection
        return
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    sys.stdin = open(os.devnull)
    try:
        with open("solution.py") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec"), module.__dict__)
    except BaseException as e:
        send({"load_error": type(e).__name__ + ": " + str(e)[:200]})
        return
    names = {}
    for name, value in list(module.__dict__.items()):
        if name.startswith("__"):
            continue
        if callable(value):
            names[name] = ["callable"]
            continue
        try:
            encoded = encode(value)
        except Exception:
            continue
        if len(json.dumps(encoded)) < 1 << 20:
            names[name] = ["value", encoded]
    send({"loaded": names})
    while True:
        request = receive()
        if request is None:
            return
        function = module.__dict__.get(request["call"])
        try:
            if not callable(function):
                raise NameError("name '%s' is not defined" % request["call"])
            result = function(*decode(request["args"]), **decode(request["kwargs"]))
        except BaseException as e:
            send({"raised": [type(e).__name__, str(e)[:200]]})
            continue
        try:
            send({"value": encode(result)})
        except Exception as e:
            send({"unencodable": str(e)[:100]})

main()
)PY";

}  // namespace

const std::string& judge_source() {
  static const std::string source = std::string{codec} + judge;
  return source;
}

const std::string& runner_source() {
  static const std::string source = std::string{codec} + runner;
  return source;
}

std::string judge_input(const std::string& marker, const code_task& task) {
  nlohmann::json j{{"setup", task.test_setup},
                   {"entry_points", task.entry_points},
                   {"tests", task.assertions},
                   {"call_timeout_s", task.case_time_s}};
  return marker + "\n" + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

size_t report::passed() const {
  if (!violation.empty())
    return 0;
  size_t n = 0;
  for (int s : state)
    n += s == 1;
  return n;
}

report read_report(const std::string& out, const std::string& marker, size_t tests) {
  report r;
  r.state.assign(tests, 0);
  auto violate = [&](std::string why) {
    if (r.violation.empty())
      r.violation = std::move(why);
  };
  size_t start = 0;
  while (start < out.size()) {
    auto end = out.find('\n', start);
    if (end == std::string::npos) {
      violate("an unterminated report line");
      break;
    }
    std::string line = out.substr(start, end - start);
    start = end + 1;
    if (line.compare(0, marker.size() + 1, marker + " ") != 0) {
      violate("a report line without the run's marker");
      continue;
    }
    if (r.done) {
      violate("a report after DONE");
      continue;
    }
    std::string rest = line.substr(marker.size() + 1);
    auto word_end = rest.find(' ');
    std::string word = rest.substr(0, word_end);
    std::string tail = word_end == std::string::npos ? "" : rest.substr(word_end + 1);
    if (word == "PASS" || word == "FAIL") {
      auto number_end = tail.find(' ');
      std::string number = tail.substr(0, number_end);
      if (number.empty() || number.size() > 9 || number.find_first_not_of("0123456789") != std::string::npos ||
          (word == "PASS" && number_end != std::string::npos)) {
        violate("a malformed " + word + " line");
        continue;
      }
      size_t index = std::stoul(number);
      if (index >= tests) {
        violate("a report for test " + number + " of " + std::to_string(tests));
        continue;
      }
      if (r.state[index] != 0) {
        violate("two reports for test " + number);
        continue;
      }
      r.state[index] = word == "PASS" ? 1 : 2;
      if (word == "FAIL" && r.first_failure.empty())
        r.first_failure = "assertion " + number + " failed" +
                          (number_end == std::string::npos ? "" : ": " + tail.substr(number_end + 1));
    } else if (word == "LOAD" && r.load_error.empty()) {
      r.load_error = tail;
    } else if (word == "SETUP" && r.setup_error.empty()) {
      r.setup_error = tail;
    } else if (word == "VIOLATION") {
      violate("the solution broke the harness's protocol: " + tail);
    } else if (word == "DONE") {
      if (tail != std::to_string(tests))
        violate("DONE for " + tail + " tests, not " + std::to_string(tests));
      r.done = true;
    } else {
      violate("an unknown report \"" + word.substr(0, 20) + "\"");
    }
  }
  if (r.done && r.load_error.empty())
    for (size_t i = 0; i < tests; ++i)
      if (r.state[i] == 0)
        violate("no report for test " + std::to_string(i));
  return r;
}

}  // namespace areal::reward::harness
