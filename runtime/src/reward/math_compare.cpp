// Comparing math answers by structure, then scalar by scalar (see math_compare.hpp).
#include "math_compare.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "areal/reward/rational.hpp"
#include "math_expression.hpp"
#include "text.hpp"

namespace areal::reward::math {

namespace {

using text::trim;

// The normalized text's set braces (from "\{" and "\}").
const std::string set_open = "\xe2\xa6\x83", set_close = "\xe2\xa6\x84";

struct node {
  enum class kind { scalar, ordered, unordered, matrix, relation, binding } k = kind::scalar;
  std::string text;          // scalar: the answer; relation: "=", "<", "≤" or "≠"; binding: the name
  char open = 0, close = 0;  // ordered: its brackets
  std::vector<node> items;   // elements; rows of a matrix; a relation's sides; a binding's value
};

bool opener(std::string_view s, size_t i) {
  return s[i] == '(' || s[i] == '[' || s[i] == '{' || s.compare(i, set_open.size(), set_open) == 0;
}
bool closer(std::string_view s, size_t i) {
  return s[i] == ')' || s[i] == ']' || s[i] == '}' || s.compare(i, set_close.size(), set_close) == 0;
}

// Splits at top-level occurrences of any of `separators` (outside every bracket).
std::vector<std::string> split_top(const std::string& s, const std::vector<std::string>& separators) {
  std::vector<std::string> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    if (opener(s, i)) {
      ++depth;
    } else if (closer(s, i)) {
      --depth;
    } else if (depth == 0) {
      bool split = false;
      for (auto& sep : separators)
        if (s.compare(i, sep.size(), sep) == 0) {
          parts.push_back(s.substr(start, i - start));
          i += sep.size();
          start = i;
          split = true;
          break;
        }
      if (split)
        continue;
    }
    i += (static_cast<unsigned char>(s[i]) >= 0xe0) ? 3 : 1;  // the set braces are three bytes
  }
  parts.push_back(s.substr(start));
  return parts;
}

// Where the bracket opening at s[0] closes, or npos.
size_t matching_close(const std::string& s) {
  int depth = 0;
  for (size_t i = 0; i < s.size();) {
    if (opener(s, i))
      ++depth;
    else if (closer(s, i) && --depth == 0)
      return i;
    i += (static_cast<unsigned char>(s[i]) >= 0xe0) ? 3 : 1;
  }
  return std::string::npos;
}

// A name a value is bound to: "x", "a_3", "f(x)", "|AB|", "A:B", "S_{MBCN}:S", "(NO)/(BO)".
bool is_name(const std::string& s) {
  if (s.empty() || s.size() > 24 || (!std::isalpha(static_cast<unsigned char>(s[0])) && s[0] != '|' && s[0] != '('))
    return false;
  int depth = 0;
  bool letter = false;
  for (char c : s) {
    if (c == '(' || c == '{')
      ++depth;
    else if (c == ')' || c == '}')
      --depth;
    else if (depth == 0 && (c == '+' || c == '-' || c == '*' || c == '^' || c == ' ' || c == '\\'))
      return false;
    else if (depth == 0 && std::isdigit(static_cast<unsigned char>(c)) && !letter)
      return false;
    letter = letter || std::isalpha(static_cast<unsigned char>(c));
  }
  return letter;
}

node scalar(std::string s) {
  node n;
  n.text = trim(s);
  return n;
}

node parse(std::string s, int depth, bool reference);

node list_of(const std::vector<std::string>& parts, int depth, node::kind k, bool reference) {
  node n;
  n.k = k;
  for (auto& p : parts)
    if (!trim(p).empty())  // "19, 46, and 82": the comma and the "and" are one separator
      n.items.push_back(parse(p, depth + 1, reference));
  return n;
}

node parse_matrix(const std::string& s, int depth, bool reference) {
  auto name_end = s.find('}');
  auto name = s.substr(7, name_end - 7);
  auto end = s.rfind("\\end{" + name + "}");
  std::string body = s.substr(name_end + 1, end == std::string::npos ? std::string::npos : end - name_end - 1);
  if (name == "array" && !body.empty() && body[0] == '{')  // the column spec
    body = body.substr(std::min(body.size(), body.find('}') + 1));
  node m;
  m.k = node::kind::matrix;
  for (auto& row : split_top(body, {"\\\\"})) {
    if (trim(row).empty())
      continue;
    m.items.push_back(list_of(split_top(row, {"&"}), depth, node::kind::ordered, reference));
  }
  return m;
}

// `reference`: a chain "a < x ≤ b" is read as the interval (a, b] in a reference only
// (Math-Verify's convention: an interval answers the inequality, not the other way).
node parse(std::string s, int depth, bool reference) {
  s = trim(s);
  while (!s.empty() && (s.back() == '.' || s.back() == ' '))
    s.pop_back();
  if (depth > 8 || s.size() > 4000)
    return scalar(s);
  if (s.rfind("\\begin{", 0) == 0 && s.find('}') != std::string::npos)
    return parse_matrix(s, depth, reference);
  // "x ∈ S": the set.
  if (auto in = split_top(s, {"\xe2\x88\x88"}); in.size() == 2)
    return parse(in[1], depth + 1, reference);
  if (auto parts = split_top(s, {",", ";", " and ", " or "}); parts.size() > 1) {
    auto n = list_of(parts, depth, node::kind::unordered, reference);
    if (n.items.size() == 1)
      return n.items[0];
    return n;
  }
  if (auto parts = split_top(s, {"\xe2\x88\xaa"}); parts.size() > 1)  // ∪
    return list_of(parts, depth, node::kind::unordered, reference);
  if (auto parts = split_top(s, {"\xc2\xb1"}); parts.size() == 2) {  // a ± b
    auto a = trim(parts[0]), b = trim(parts[1]);
    auto plus = a.empty() ? b : a + "+" + b, minus = a.empty() ? "-(" + b + ")" : a + "-(" + b + ")";
    return list_of({plus, minus}, depth, node::kind::unordered, reference);
  }
  // Relations: "≈" and what follows it are not the answer.
  auto approx = split_top(s, {"\xe2\x89\x88"});
  if (approx.size() > 1)
    s = split_top(approx[0], {"="}).size() == 1 && is_name(trim(approx[0])) ? trim(approx[0]) + "=" + approx[1]
                                                                            : trim(approx[0]);
  auto equals = split_top(s, {"="});
  if (equals.size() > 1) {
    for (auto& p : equals)
      p = trim(p);
    auto& last = equals.back();
    auto& before = equals[equals.size() - 2];
    node n;
    if (is_name(before) || is_name(equals.front())) {
      n.k = node::kind::binding;
      n.text = is_name(before) ? before : equals.front();
      n.text.erase(std::remove(n.text.begin(), n.text.end(), ' '), n.text.end());
      n.items.push_back(parse(last, depth + 1, reference));
    } else {
      n.k = node::kind::relation;
      n.text = "=";
      n.items = {parse(equals.front(), depth + 1, reference), parse(last, depth + 1, reference)};
    }
    return n;
  }
  for (auto [op, flipped, canonical] :
       {std::tuple{"\xe2\x89\xa4", false, "\xe2\x89\xa4"}, std::tuple{"\xe2\x89\xa5", true, "\xe2\x89\xa4"},
        std::tuple{"\xe2\x89\xa0", false, "\xe2\x89\xa0"}, std::tuple{"<", false, "<"}, std::tuple{">", true, "<"}}) {
    auto sides = split_top(s, {op});
    if (sides.size() == 2) {
      node n;
      n.k = node::kind::relation;
      n.text = canonical;
      n.items = {parse(sides[flipped ? 1 : 0], depth + 1, reference),
                 parse(sides[flipped ? 0 : 1], depth + 1, reference)};
      return n;
    }
    if (sides.size() > 2)
      break;
  }
  // "a < x ≤ b": the interval of x, (a, b].
  {
    std::vector<std::string> parts;
    std::vector<bool> strict;
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
      bool lt = s[i] == '<', le = s.compare(i, 3, "\xe2\x89\xa4") == 0;
      if (lt || le) {
        parts.push_back(trim(s.substr(start, i - start)));
        strict.push_back(lt);
        i += lt ? 1 : 3;
        start = i;
      } else {
        ++i;
      }
    }
    parts.push_back(trim(s.substr(start)));
    if (reference && parts.size() == 3 && is_name(parts[1])) {
      auto n = list_of({parts[0], parts[2]}, depth, node::kind::ordered, reference);
      n.open = strict[0] ? '(' : '[';
      n.close = strict[1] ? ')' : ']';
      return n;
    }
    if (parts.size() > 2)
      return scalar(s);  // another chain: compared as written
  }
  // Brackets around the whole answer.
  auto close = s.empty() || !opener(s, 0) ? std::string::npos : matching_close(s);
  size_t close_len = close != std::string::npos && s.compare(close, set_close.size(), set_close) == 0 ? 3 : 1;
  if (close != std::string::npos && close + close_len == s.size()) {
    bool is_set = s[0] == '{' || s.compare(0, set_open.size(), set_open) == 0;
    size_t open_len = s.compare(0, set_open.size(), set_open) == 0 ? 3 : 1;
    auto inner = s.substr(open_len, close - open_len);
    auto parts = split_top(inner, {",", ";"});
    if (parts.size() == 1)
      return parse(inner, depth + 1, reference);
    if (is_set)
      return list_of(parts, depth, node::kind::unordered, reference);
    auto n = list_of(parts, depth, node::kind::ordered, reference);
    n.open = s[0];
    n.close = s[close];
    return n;
  }
  return scalar(s);
}

// -- scalars ----------------------------------------------------------------------

std::string without_spaces(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
          s.end());
  return s;
}

// Outer parentheses around the whole text removed ("(1/3)" -> "1/3").
std::string unparenthesized(std::string s) {
  while (s.size() >= 2 && s.front() == '(' && matching_close(s) == s.size() - 1)
    s = s.substr(1, s.size() - 2);
  return s;
}

// "12", "-3/4", "(1/3)", "(-1)/2", "0.25": the exact value; `decimal` if written with a point.
std::optional<rational> plain_number(const std::string& text, bool& decimal) {
  auto s = unparenthesized(without_spaces(text));
  auto slash = split_top(s, {"/"});
  if (slash.size() == 2) {
    bool d1 = false, d2 = false;
    auto a = parse_rational(unparenthesized(slash[0]), &d1);
    auto b = parse_rational(unparenthesized(slash[1]), &d2);
    decimal = d1 || d2;
    return a && b ? a->divide(*b) : std::nullopt;
  }
  if (slash.size() > 2)
    return std::nullopt;
  return parse_rational(s, &decimal);
}

// Text answers: case, spaces and parentheses around one letter ("(C)") do not matter.
std::string text_key(const std::string& s) {
  auto k = without_spaces(s);
  for (auto& c : k)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (k.size() == 3 && k[0] == '(' && k[2] == ')' && std::isalpha(static_cast<unsigned char>(k[1])))
    k = k.substr(1, 1);
  return k;
}

bool scalars_equal(std::string a, std::string r, const comparison_options& o, std::string& why) {
  a = trim(a);
  r = trim(r);
  // Percent: "/100" only where the reference does not say percent itself.
  bool r_percent = !r.empty() && r.back() == '%', a_percent = !a.empty() && a.back() == '%';
  if (r_percent) {
    r = trim(r.substr(0, r.size() - 1));
    if (a_percent)
      a = trim(a.substr(0, a.size() - 1));
  } else if (a_percent) {
    a = "(" + trim(a.substr(0, a.size() - 1)) + ")/100";
  }
  bool a_decimal = false, r_decimal = false;
  auto av = plain_number(a, a_decimal);
  auto rv = plain_number(r, r_decimal);
  if (av && rv) {
    if (!r_decimal) {
      why = "exactly equal as rationals";
      return *av == *rv;
    }
    auto x = static_cast<double>(av->approx()), y = static_cast<double>(rv->approx());
    why = "within the relative tolerance of a decimal reference";
    return std::fabs(x - y) <= o.relative_tolerance * std::max(std::fabs(x), std::fabs(y));
  }
  if (!a.empty() && text_key(a) == text_key(r)) {
    why = "equal as text";
    return true;
  }
  auto ga = ginac_syntax(a), gr = ginac_syntax(r);
  if (ga && gr) {
    bool decimal_reference = r.find('.') != std::string::npos;
    if (auto equal = expressions_equal(*ga, *gr, decimal_reference ? o.relative_tolerance : 0)) {
      why = *equal ? "equal as expressions" : "different expressions";
      return *equal;
    }
  }
  why = "different";
  return false;
}

// -- structures ---------------------------------------------------------------------

bool equal(const node& a, const node& r, const comparison_options& o, std::string& why, int depth = 0);

std::vector<const node*> elements(const node& n) {
  std::vector<const node*> out;
  if (n.k == node::kind::unordered || n.k == node::kind::ordered)
    for (auto& i : n.items)
      out.push_back(&i);
  else
    out.push_back(&n);
  return out;
}

bool in_order(const std::vector<const node*>& a, const std::vector<const node*>& r, const comparison_options& o,
              std::string& why, int depth) {
  if (a.size() != r.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!equal(*a[i], *r[i], o, why, depth + 1))
      return false;
  return true;
}

// As sets: every element of each has an equal one in the other (a repeated element counts once).
bool as_sets(const std::vector<const node*>& a, const std::vector<const node*>& r, const comparison_options& o,
             std::string& why, int depth) {
  if (a.size() > 64 || r.size() > 64)
    return false;
  auto covered = [&](const std::vector<const node*>& xs, const std::vector<const node*>& ys) {
    for (auto* x : xs) {
      bool found = false;
      for (size_t j = 0; j < ys.size() && !found; ++j)
        found = equal(*x, *ys[j], o, why, depth + 1);
      if (!found)
        return false;
    }
    return true;
  };
  return covered(a, r) && covered(r, a);
}

std::string side_text(const node& n) {
  return n.k == node::kind::scalar ? n.text : "";
}

bool relations_equal(const node& a, const node& r, const comparison_options& o, std::string& why, int depth) {
  if (a.text != r.text || a.items.size() != 2 || r.items.size() != 2)
    return false;
  // Sides that are tuples, sets or matrices: side by side.
  for (auto* side : {&a.items[0], &a.items[1], &r.items[0], &r.items[1]})
    if (side->k != node::kind::scalar)
      return equal(a.items[0], r.items[0], o, why, depth + 1) && equal(a.items[1], r.items[1], o, why, depth + 1);
  auto al = side_text(a.items[0]), ar = side_text(a.items[1]);
  auto rl = side_text(r.items[0]), rr = side_text(r.items[1]);
  if (text_key(al) == text_key(rl) && text_key(ar) == text_key(rr)) {
    why = "the same relation";
    return true;
  }
  auto ga = ginac_syntax("(" + al + ")-(" + ar + ")"), gr = ginac_syntax("(" + rl + ")-(" + rr + ")");
  if (!ga || !gr)
    return false;
  auto ratio = constant_ratio(*ga, *gr);
  if (!ratio)
    return false;
  why = "the same relation, rearranged";
  // Scaling an inequality by a negative number turns it around.
  return a.text == "=" || a.text == "\xe2\x89\xa0" || *ratio > 0;
}

bool equal(const node& a, const node& r, const comparison_options& o, std::string& why, int depth) {
  using k = node::kind;
  if (depth > 16)
    return false;
  // A name bound to a value against an equation: the equation "name = value".
  if ((a.k == k::binding && r.k == k::relation) || (a.k == k::relation && r.k == k::binding)) {
    auto as_relation = [](const node& b) {
      if (b.k != k::binding)
        return b;
      node n;
      n.k = k::relation;
      n.text = "=";
      n.items = {scalar(b.text), b.items[0]};
      return n;
    };
    return relations_equal(as_relation(a), as_relation(r), o, why, depth);
  }
  if (r.k == k::binding) {
    if (a.k == k::binding)
      return a.text == r.text && equal(a.items[0], r.items[0], o, why, depth + 1);
    return equal(a, r.items[0], o, why, depth + 1);
  }
  if (a.k == k::binding)
    return equal(a.items[0], r, o, why, depth + 1);
  // An answer that ends its equation with a value ("1/2 = 10/9") against a value: that last value.
  if (a.k == k::relation && a.text == "=" && r.k != k::relation && r.k != k::binding)
    return equal(a.items[1], r, o, why, depth + 1);
  if (a.k == k::relation || r.k == k::relation)
    return a.k == r.k && relations_equal(a, r, o, why, depth);
  if (a.k == k::matrix || r.k == k::matrix) {
    if (a.k != r.k || a.items.size() != r.items.size())
      return false;
    for (size_t i = 0; i < a.items.size(); ++i)
      if (!in_order(elements(a.items[i]), elements(r.items[i]), o, why, depth))
        return false;
    return true;
  }
  auto ae = elements(a), re = elements(r);
  if (a.k == k::ordered && r.k == k::ordered) {
    if (a.open != r.open || a.close != r.close)
      return false;
    return in_order(ae, re, o, why, depth);
  }
  if (a.k == k::ordered || r.k == k::ordered)  // a tuple against a set: the set as written
    return in_order(ae, re, o, why, depth);
  if (a.k == k::unordered || r.k == k::unordered)
    return as_sets(ae, re, o, why, depth);
  return scalars_equal(a.text, r.text, o, why);
}

}  // namespace

bool equivalent(const std::string& answer, const std::string& reference, const comparison_options& options,
                std::string& why) {
  return equal(parse(answer, 0, false), parse(reference, 0, true), options, why);
}

}  // namespace areal::reward::math
