// Reading a normalized math answer into its structure (internal): lists,
// sets and unions, tuples and intervals, matrices (and sums and products of
// written-out matrices), equations, inequalities and their chains, and names
// bound to values; what is left is a scalar, compared by math_compare.cpp.
#pragma once

#include <string>
#include <vector>

namespace areal::reward::math {

struct node {
  enum class kind { scalar, ordered, unordered, matrix, relation, binding, chain } k = kind::scalar;
  // scalar: the answer; relation: "=", "<", "≤" or "≠"; binding: the name; chain: one letter per
  // relation, 's' for "<" and 'n' for "≤", the chain read from its least end ("a < x ≤ b": "sn").
  std::string text;
  char open = 0, close = 0;  // ordered: its brackets
  std::vector<node> items;   // elements; rows of a matrix; a relation's sides; a binding's value; a chain's terms
};

/// The structure of a normalized answer (normalize_math_answer); `depth` bounds the nesting.
node parse_structure(std::string answer, int depth = 0);

node scalar(std::string text);

/// Splits at top-level occurrences of any of `separators` (outside every bracket).
std::vector<std::string> split_top(const std::string& s, const std::vector<std::string>& separators);

/// Where the bracket opening at s[0] closes, or npos.
size_t matching_close(const std::string& s);

/// A name a value is bound to: "x", "a_3", "f(x)", "|AB|", "A:B", "S_{MBCN}:S", "(NO)/(BO)".
bool is_name(const std::string& s);

}  // namespace areal::reward::math
