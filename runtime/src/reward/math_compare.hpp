// Comparing two math answers (internal): their structure first (tuples,
// intervals, sets and lists, matrices, equations and inequalities, a name
// bound to a value), then each scalar: exactly as rationals, within the
// tolerance only when the reference is a decimal, symbolically and
// numerically as expressions (math_expression.hpp), else as text.
#pragma once

#include <string>

namespace areal::reward::math {

struct comparison_options {
  double relative_tolerance = 1e-4;  // for decimal references only
  // An answer written as a chain of inequalities ("-2 ≤ x ≤ 7") answers a reference interval
  // ("x ∈ [-2, 7]"); the reverse always holds.
  bool chain_answers_interval = false;
};

/// Whether `answer` means `reference`; both are normalized answers
/// (normalize_math_answer). `why` says what decided it.
bool equivalent(const std::string& answer, const std::string& reference, const comparison_options& options,
                std::string& why);

}  // namespace areal::reward::math
