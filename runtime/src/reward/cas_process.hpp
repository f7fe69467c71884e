// The algebra process of a thread (internal). GiNaC is not thread-safe: in
// one process every comparison would take one lock, and threads that share
// GiNaC's global objects slow each other down even then. So each thread that
// compares expressions gets a process of its own, forked from this one on
// first use, that runs the comparisons it is sent one at a time. A comparison
// that runs past its time limit or crashes GiNaC ends that process, not this
// one: the caller gets no answer, and its next call starts a fresh process.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace areal::reward::math {

enum class cas_op : uint8_t { equal = 1, ratio = 2 };

/// What a comparison found: `known` false when it could not decide.
struct cas_answer {
  bool known = false;
  double value = 0;  // equal: 1 or 0; ratio: the constant
};

/// The comparison itself (run inside the algebra process, or here when there is none).
using cas_compute = cas_answer (*)(cas_op op, const std::string& a, const std::string& b, double tolerance);

struct cas_result {
  enum class status { answered, failed, unavailable } outcome = status::unavailable;
  cas_answer answer;
};

/// Held by whatever runs GiNaC in this process (the fallback when there is no algebra
/// process), and while an algebra process is forked: it never starts mid-computation.
std::mutex& in_process_cas_mutex();

/// The comparisons an algebra process runs (math_expression.cpp): the ones the
/// areal-algebra program serves.
cas_answer builtin_comparison(cas_op op, const std::string& a, const std::string& b, double tolerance);

/// Runs `compute(op, a, b, tolerance)` in the calling thread's algebra process within
/// `limit`. failed: the process crashed or ran past the limit (it was killed);
/// unavailable: no process could be started (the caller computes here instead).
/// For builtin_comparison the process is the areal-algebra program, started
/// with posix_spawn (helper_programs.hpp); for any other function, and where
/// that program is missing, a fork of this process, which keeps every page
/// this process rewrites after it (a trainer's weights) for as long as it lives.
cas_result run_in_cas_process(cas_compute compute, cas_op op, const std::string& a, const std::string& b,
                              double tolerance, std::chrono::milliseconds limit);

/// An algebra process's loop on socket `fd`: one request at a time until it closes.
[[noreturn]] void serve_cas(int fd, cas_compute compute);

}  // namespace areal::reward::math
