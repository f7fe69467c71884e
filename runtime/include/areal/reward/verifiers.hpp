// Verifiers turn a model's response into a reward. Each is a pure function of
// (response, task) that is bounded in time by construction: inputs are capped
// in length, parsers in depth, arithmetic is exact and overflow-checked. The
// code verifier runs programs, and does so in the sandbox (sandbox.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "areal/messages/records.hpp"
#include "areal/reward/rational.hpp"

namespace areal::reward {

struct verification {
  verdict judged = verdict::unscored;
  float reward = 0.0f;
  std::string detail;  // what was extracted and why it was judged so
};

// -- math -----------------------------------------------------------------------

/// The final answer of a response: the last \boxed{...} (nested braces), else the
/// text after the last "the answer is", else the last number. nullopt: none.
std::optional<std::string> extract_math_answer(std::string_view response);

/// Canonical text of an answer: LaTeX wrappers, spaces, thousands separators,
/// percent signs, degree signs, trailing units and periods removed, \frac{a}{b} -> a/b.
std::string normalize_math_answer(std::string_view answer);

struct math_options {
  double relative_tolerance = 1e-4;  // for answers written as decimals
};

/// Correct when the extracted answer equals any reference: exactly as rationals
/// when both are integers or fractions, within the relative tolerance when either
/// is written as a decimal, else as normalized text.
verification verify_math(std::string_view response, const std::vector<std::string>& references,
                         const math_options& options = {});

// -- countdown --------------------------------------------------------------------

/// The expression of a countdown response: inside <answer>...</answer>, else the
/// last \boxed{}, else after "the answer is", else the last non-empty line; the
/// part before an '=' when there is one.
std::optional<std::string> extract_countdown_expression(std::string_view response);

struct countdown_options {
  bool use_all_numbers = false;  // true: every given number must be used
  size_t max_expression_chars = 256;
  int max_depth = 32;  // parenthesis nesting
};

/// Evaluates an expression of integers, + - * / and parentheses with exact
/// rational arithmetic; the numbers it uses are appended to `used`.
/// Returns the value or an error text.
struct evaluation {
  std::optional<rational> value;
  std::string error;
};
evaluation evaluate_expression(std::string_view expression, std::vector<long long>* used,
                               const countdown_options& options = {});

/// Correct when the expression uses only the given numbers (each at most as often
/// as given) and evaluates exactly to the target.
verification verify_countdown(std::string_view response, const std::vector<long long>& numbers, long long target,
                              const countdown_options& options = {});

}  // namespace areal::reward
