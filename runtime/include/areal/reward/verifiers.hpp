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

/// The final answers of a response, in order: the last \boxed{...} (nested braces)
/// with the boxed answers before it that the text joins to it as a list
/// ("\boxed{1}, \boxed{2}", "\boxed{6} and \boxed{8}"),
/// else the math or the sentence after the last "the answer is" / "answer:" (or
/// "Answer" followed by math), else the whole response when it is nothing but
/// one answer ("$\frac13$", "x = 5"), else, only with `unmarked_fallback`, the
/// last math segment ($...$, \(...\), \[...\]) and then the last number that
/// stands alone. With `last_number_is_answer` (tasks whose responses are bare
/// numbers), the last number comes right after the marked answers. Empty: no answer.
std::vector<std::string> extract_math_answers(std::string_view response, bool unmarked_fallback = false,
                                              bool last_number_is_answer = false);

/// Canonical text of an answer: LaTeX spacing, wrappers (\text, \mathrm, ...),
/// delimiters and degree signs removed; relations, sets, infinity and plus-minus
/// spelled one way; "\frac{a}{b}" -> "(a)/(b)"; percent words -> "%";
/// thousands separators joined where they are unambiguous; trailing units
/// dropped unless words qualify the number ("12 or more").
std::string normalize_math_answer(std::string_view answer);

struct math_options {
  double relative_tolerance = 1e-4;     // for references written as decimals only
  bool unmarked_fallback = false;       // an unmarked response is read by its last math or a number after it
  bool last_number_is_answer = false;   // the task's responses are bare numbers: the last one is the answer
  bool chain_answers_interval = false;  // "-2 ≤ x ≤ 7" answers "x ∈ [-2, 7]" (the reverse always does)
};

/// Correct when an extracted answer means a reference (math_compare.hpp):
/// integers and fractions exactly, decimals within the tolerance only when the
/// reference is a decimal; percent as /100 unless the reference is a percent;
/// tuples and intervals in order with their brackets, sets and lists in any
/// order; equations and inequalities with their sides moved or scaled;
/// expressions symbolically and numerically (GiNaC); otherwise as text.
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
