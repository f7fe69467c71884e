// Reading a math answer's structure (see math_structure.hpp).
#include "math_structure.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <tuple>

#include "text.hpp"

namespace areal::reward::math {

using text::trim;

// The normalized text's set braces (from "\{" and "\}").
const std::string set_open = "\xe2\xa6\x83", set_close = "\xe2\xa6\x84";

namespace {

bool opener(std::string_view s, size_t i) {
  return s[i] == '(' || s[i] == '[' || s[i] == '{' || s.compare(i, set_open.size(), set_open) == 0;
}
bool closer(std::string_view s, size_t i) {
  return s[i] == ')' || s[i] == ']' || s[i] == '}' || s.compare(i, set_close.size(), set_close) == 0;
}

}  // namespace

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

namespace {

node list_of(const std::vector<std::string>& parts, int depth, node::kind k) {
  node n;
  n.k = k;
  for (auto& p : parts)
    if (!trim(p).empty())  // "19, 46, and 82": the comma and the "and" are one separator
      n.items.push_back(parse_structure(p, depth + 1));
  return n;
}

node parse_matrix(const std::string& s, int depth) {
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
    m.items.push_back(list_of(split_top(row, {"&"}), depth, node::kind::ordered));
  }
  return m;
}

// "A + B", "A - B", "A B", "A \cdot B" of matrices written out: the matrix they make, cell by
// cell as expressions ("(1)+(5)"); nothing when `s` is not such arithmetic or sizes do not fit.
std::optional<node> matrix_arithmetic(const std::string& s, int depth) {
  using cells = std::vector<std::vector<std::string>>;
  constexpr size_t max_size = 10;
  auto cells_of = [&](const std::string& text) -> std::optional<cells> {
    auto m = parse_matrix(text, depth);
    cells out;
    for (auto& row : m.items) {
      out.emplace_back();
      for (auto& cell : row.items) {
        if (cell.k != node::kind::scalar || cell.text.empty())
          return std::nullopt;
        out.back().push_back(cell.text);
      }
      if (out.back().size() != out.front().size() || out.back().size() > max_size)
        return std::nullopt;
    }
    if (out.empty() || out.size() > max_size)
      return std::nullopt;
    return out;
  };
  auto product = [](const cells& a, const cells& b) -> std::optional<cells> {
    if (a.front().size() != b.size())
      return std::nullopt;
    cells out(a.size(), std::vector<std::string>(b.front().size()));
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t j = 0; j < b.front().size(); ++j)
        for (size_t k = 0; k < b.size(); ++k)
          out[i][j] += (k ? "+" : "") + std::string{"("} + a[i][k] + ")*(" + b[k][j] + ")";
    return out;
  };
  // Terms (a sign and a product of matrices), read left to right.
  std::optional<cells> sum, term;
  char sign = '+';
  size_t pos = 0, matrices = 0;
  auto close_term = [&]() -> bool {
    if (!sum) {
      sum = term;
      if (sign == '-')
        for (auto& row : *sum)
          for (auto& cell : row)
            cell = "-(" + cell + ")";
      return true;
    }
    if (sum->size() != term->size() || sum->front().size() != term->front().size())
      return false;
    for (size_t i = 0; i < sum->size(); ++i)
      for (size_t j = 0; j < sum->front().size(); ++j)
        (*sum)[i][j] = "(" + (*sum)[i][j] + ")" + sign + "(" + (*term)[i][j] + ")";
    return true;
  };
  while (pos < s.size()) {
    if (s.compare(pos, 7, "\\begin{") != 0)
      return std::nullopt;
    auto name_end = s.find('}', pos);
    auto end_tag = "\\end{" + s.substr(pos + 7, name_end - pos - 7) + "}";
    auto end = s.find(end_tag, name_end);
    if (name_end == std::string::npos || end == std::string::npos || ++matrices > 8)
      return std::nullopt;
    auto m = cells_of(s.substr(pos, end + end_tag.size() - pos));
    if (!m)
      return std::nullopt;
    term = term ? product(*term, *m) : m;
    if (!term)
      return std::nullopt;
    pos = s.find_first_not_of(' ', end + end_tag.size());
    if (pos == std::string::npos)
      break;
    for (auto times : {"\\cdot", "\\times", "*"})
      if (s.compare(pos, std::string_view{times}.size(), times) == 0)
        pos = s.find_first_not_of(' ', pos + std::string_view{times}.size());
    if (pos != std::string::npos && (s[pos] == '+' || s[pos] == '-')) {
      if (!close_term())
        return std::nullopt;
      sign = s[pos];
      term.reset();
      pos = s.find_first_not_of(' ', pos + 1);
    }
    if (pos == std::string::npos)
      return std::nullopt;
  }
  if (matrices < 2 || !term || !close_term())
    return std::nullopt;
  node n;
  n.k = node::kind::matrix;
  for (auto& row : *sum) {
    node r;
    r.k = node::kind::ordered;
    for (auto& cell : row)
      r.items.push_back(scalar(cell));
    n.items.push_back(std::move(r));
  }
  return n;
}

// A chain of three or more terms joined by "<" and "≤" only, or by ">" and "≥" only (then
// read backwards); nothing when `s` is no such chain; a scalar when the directions are mixed.
std::optional<node> parse_chain(const std::string& s, int depth) {
  std::vector<std::string> terms;
  std::string relations;
  bool up = false, down = false;
  size_t start = 0;
  int nesting = 0;
  for (size_t i = 0; i < s.size();) {
    if (opener(s, i))
      ++nesting;
    else if (closer(s, i))
      --nesting;
    size_t width = s[i] == '<' || s[i] == '>' ? 1 : 0;
    bool le = s.compare(i, 3, "\xe2\x89\xa4") == 0, ge = s.compare(i, 3, "\xe2\x89\xa5") == 0;
    width = le || ge ? 3 : width;
    if (width == 0 || nesting != 0) {
      i += (static_cast<unsigned char>(s[i]) >= 0xe0) ? 3 : 1;
      continue;
    }
    terms.push_back(trim(s.substr(start, i - start)));
    relations += s[i] == '<' || s[i] == '>' ? 's' : 'n';
    (s[i] == '<' || le ? up : down) = true;
    i += width;
    start = i;
  }
  terms.push_back(trim(s.substr(start)));
  if (terms.size() < 3)
    return std::nullopt;
  if (up && down)
    return scalar(s);  // "a < b > c": compared as written
  if (down) {
    std::reverse(terms.begin(), terms.end());
    std::reverse(relations.begin(), relations.end());
  }
  node n;
  n.k = node::kind::chain;
  n.text = relations;
  for (auto& t : terms)
    n.items.push_back(parse_structure(t, depth + 1));
  return n;
}

}  // namespace

node parse_structure(std::string s, int depth) {
  s = trim(s);
  while (!s.empty() && (s.back() == '.' || s.back() == ' '))
    s.pop_back();
  if (depth > 8 || s.size() > 4000)
    return scalar(s);
  if (s.rfind("\\begin{", 0) == 0 && s.find('}') != std::string::npos) {
    if (auto result = matrix_arithmetic(s, depth))
      return *result;
    return parse_matrix(s, depth);
  }
  // "x ∈ S": the set.
  if (auto in = split_top(s, {"\xe2\x88\x88"}); in.size() == 2)
    return parse_structure(in[1], depth + 1);
  // "p=5,q=2;p=7,q=2": a set of solutions, each naming its values.
  if (auto groups = split_top(s, {";"}); groups.size() > 1) {
    node solutions;
    solutions.k = node::kind::unordered;
    bool named = true;
    for (auto& group : groups) {
      auto solution = list_of(split_top(group, {","}), depth, node::kind::unordered);
      named = named && solution.items.size() > 1 &&
              std::all_of(solution.items.begin(), solution.items.end(),
                          [](const node& n) { return n.k == node::kind::binding; });
      solutions.items.push_back(std::move(solution));
    }
    if (named)
      return solutions;
  }
  if (auto parts = split_top(s, {",", ";", " and ", " or "}); parts.size() > 1) {
    auto n = list_of(parts, depth, node::kind::unordered);
    if (n.items.size() == 1)
      return n.items[0];
    return n;
  }
  if (auto parts = split_top(s, {"\xe2\x88\xaa"}); parts.size() > 1)  // ∪
    return list_of(parts, depth, node::kind::unordered);
  if (auto parts = split_top(s, {"\xc2\xb1"}); parts.size() == 2) {  // a ± b
    auto a = trim(parts[0]), b = trim(parts[1]);
    auto plus = a.empty() ? b : a + "+" + b, minus = a.empty() ? "-(" + b + ")" : a + "-(" + b + ")";
    return list_of({plus, minus}, depth, node::kind::unordered);
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
      n.items.push_back(parse_structure(last, depth + 1));
    } else {
      n.k = node::kind::relation;
      n.text = "=";
      n.items = {parse_structure(equals.front(), depth + 1), parse_structure(last, depth + 1)};
    }
    return n;
  }
  // "a < x ≤ b" (or "b ≥ x > a"): a chain, in one direction.
  if (auto chain = parse_chain(s, depth); chain)
    return *chain;
  for (auto [op, flipped, canonical] :
       {std::tuple{"\xe2\x89\xa4", false, "\xe2\x89\xa4"}, std::tuple{"\xe2\x89\xa5", true, "\xe2\x89\xa4"},
        std::tuple{"\xe2\x89\xa0", false, "\xe2\x89\xa0"}, std::tuple{"<", false, "<"}, std::tuple{">", true, "<"}}) {
    auto sides = split_top(s, {op});
    if (sides.size() == 2) {
      node n;
      n.k = node::kind::relation;
      n.text = canonical;
      n.items = {parse_structure(sides[flipped ? 1 : 0], depth + 1),
                 parse_structure(sides[flipped ? 0 : 1], depth + 1)};
      return n;
    }
    if (sides.size() > 2)
      break;
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
      return parse_structure(inner, depth + 1);
    if (is_set)
      return list_of(parts, depth, node::kind::unordered);
    auto n = list_of(parts, depth, node::kind::ordered);
    n.open = s[0];
    n.close = s[close];
    return n;
  }
  return scalar(s);
}

}  // namespace areal::reward::math
