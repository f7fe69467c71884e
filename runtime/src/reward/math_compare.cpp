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
#include "math_structure.hpp"
#include "text.hpp"

namespace areal::reward::math {

namespace {

using text::trim;

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

// "a < x ≤ b" as the interval of x, (a, b]; nothing when the middle term is no name (or is |x|).
// The interval from `lo` to `hi`, each end open when `strict`.
node interval_node(node lo, node hi, bool strict_lo, bool strict_hi) {
  node n;
  n.k = node::kind::ordered;
  n.items = {std::move(lo), std::move(hi)};
  n.open = strict_lo ? '(' : '[';
  n.close = strict_hi ? ')' : ']';
  return n;
}

std::optional<node> chain_interval(const node& chain) {
  if (chain.items.size() != 3 || chain.items[1].k != node::kind::scalar || !is_name(chain.items[1].text) ||
      chain.items[1].text[0] == '|')
    return std::nullopt;
  return interval_node(chain.items[0], chain.items[2], chain.text[0] == 's', chain.text[1] == 's');
}

// "a ≤ |x| ≤ b" with a > 0 as the union of x's two intervals, [-b, -a] ∪ [a, b].
std::optional<node> absolute_chain_union(const node& chain) {
  if (chain.items.size() != 3 || chain.items[1].k != node::kind::scalar || chain.items[0].k != node::kind::scalar ||
      chain.items[2].k != node::kind::scalar)
    return std::nullopt;
  auto& middle = chain.items[1].text;
  if (middle.size() < 3 || middle.front() != '|' || middle.back() != '|' ||
      !is_name(trim(middle.substr(1, middle.size() - 2))))
    return std::nullopt;
  bool decimal = false;
  auto low = plain_number(chain.items[0].text, decimal);
  if (!low || low->approx() <= 0)
    return std::nullopt;
  bool strict_a = chain.text[0] == 's', strict_b = chain.text[1] == 's';
  auto& a = chain.items[0].text;
  auto& b = chain.items[2].text;
  node u;
  u.k = node::kind::unordered;
  u.items = {interval_node(scalar("-(" + b + ")"), scalar("-(" + a + ")"), strict_b, strict_a),
             interval_node(scalar(a), scalar(b), strict_a, strict_b)};
  return u;
}

// Chains: term by term; a reference chain "a < x ≤ b" is also answered by its interval, and
// "a ≤ |x| ≤ b" by its union; an answer chain answers a reference interval only when allowed.
bool chains_equal(const node& a, const node& r, const comparison_options& o, std::string& why, int depth) {
  using k = node::kind;
  if (a.k == k::chain && r.k == k::chain) {
    if (a.text != r.text || a.items.size() != r.items.size())
      return false;
    for (size_t i = 0; i < a.items.size(); ++i)
      if (!equal(a.items[i], r.items[i], o, why, depth + 1))
        return false;
    why = "the same chain";
    return true;
  }
  if (r.k == k::chain) {
    if (auto interval = chain_interval(r))
      return equal(a, *interval, o, why, depth + 1);
    if (auto u = absolute_chain_union(r))
      return equal(a, *u, o, why, depth + 1);
    return false;
  }
  if (o.chain_answers_interval)
    if (auto interval = chain_interval(a))
      return equal(*interval, r, o, why, depth + 1);
  return false;
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
  if (a.k == k::chain || r.k == k::chain)
    return chains_equal(a, r, o, why, depth);
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
  return equal(parse_structure(answer, 0), parse_structure(reference, 0), options, why);
}

}  // namespace areal::reward::math
