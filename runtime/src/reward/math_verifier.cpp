// Math answers: normalization, and the verdict; extraction is math_extract.cpp, comparison math_compare.cpp.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "areal/reward/verifiers.hpp"
#include "math_compare.hpp"
#include "text.hpp"

namespace areal::reward {

namespace {

using text::brace_group;
using text::is_number_char;
using text::lowercase;
using text::trim;

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty())
    return;
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

// Where the command `name` ("\\text") occurs at or after `from` as a whole command (not "\\textbf").
size_t find_command(const std::string& s, std::string_view name, size_t from = 0) {
  for (size_t pos = s.find(name, from); pos != std::string::npos; pos = s.find(name, pos + 1)) {
    auto after = pos + name.size();
    if (after >= s.size() || !std::isalpha(static_cast<unsigned char>(s[after])))
      return pos;
  }
  return std::string::npos;
}

void replace_command(std::string& s, std::string_view name, std::string_view to) {
  for (size_t pos = find_command(s, name); pos != std::string::npos; pos = find_command(s, name, pos + to.size()))
    s.replace(pos, name.size(), to);
}

// "\name{X}" -> "X" for every occurrence (nested groups kept intact).
void unwrap_command(std::string& s, std::string_view name) {
  for (size_t pos = find_command(s, name); pos != std::string::npos; pos = find_command(s, name, pos)) {
    auto after = pos + name.size();
    while (after < s.size() && s[after] == ' ')
      ++after;
    auto group = brace_group(s, after);
    if (!group) {
      s.erase(pos, name.size());
      continue;
    }
    s.replace(pos, group->second - pos, group->first);
  }
}

bool simple_operand(const std::string& x) {
  return !x.empty() && x.find_first_of("+-*/^ ") == std::string::npos;
}

// "\frac{a}{b}" and "\frac12" -> "a/b" ("(a)/(b)" when the parts are compound).
void rewrite_fractions(std::string& s) {
  replace_all(s, "\\dfrac", "\\frac");
  replace_all(s, "\\tfrac", "\\frac");
  for (size_t pos = s.find("\\frac"); pos != std::string::npos; pos = s.find("\\frac", pos)) {
    size_t at = pos + 5;
    auto operand = [&](std::string& out) -> bool {
      while (at < s.size() && s[at] == ' ')
        ++at;
      if (at >= s.size())
        return false;
      if (s[at] == '{') {
        auto g = brace_group(s, at);
        if (!g)
          return false;
        out = g->first;
        at = g->second;
      } else {
        out = std::string(1, s[at++]);  // \frac12 shorthand: one character each
      }
      return true;
    };
    std::string a, b;
    if (!operand(a) || !operand(b)) {
      s.erase(pos, 5);
      continue;
    }
    auto wrap = [](const std::string& x) { return simple_operand(x) ? x : "(" + x + ")"; };
    auto replacement = wrap(a) + "/" + wrap(b);
    s.replace(pos, at - pos, replacement);
    pos += replacement.size();
  }
}

// "1,234,567.5" -> "1234567.5" when the commas sit exactly every three digits.
std::string drop_thousands_separators(const std::string& s) {
  size_t start = (!s.empty() && s[0] == '-') ? 1 : 0;
  size_t end = s.find('.') == std::string::npos ? s.size() : s.find('.');
  auto integer = s.substr(start, end - start);
  if (integer.find(',') == std::string::npos)
    return s;
  size_t first = integer.find(',');
  if (first == 0 || first > 3)
    return s;
  for (size_t i = 0; i < integer.size(); ++i) {
    bool comma_place = i >= first && (i - first) % 4 == 0;
    if (comma_place != (integer[i] == ','))
      return s;
    if (!comma_place && !is_number_char(integer[i]))
      return s;
  }
  if ((integer.size() - first) % 4 != 0)
    return s;
  std::string out = s.substr(0, start);
  for (char c : integer)
    if (c != ',')
      out += c;
  return out + s.substr(end);
}

// "14{,}916" and "14 {, }916" -> "14916"; a "{,}" elsewhere is a comma.
std::string without_braced_thousands_commas(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '{') {
      auto j = s.find_first_not_of(' ', i + 1);
      auto k = j == std::string::npos || s[j] != ',' ? std::string::npos : s.find_first_not_of(' ', j + 1);
      if (k != std::string::npos && s[k] == '}') {
        auto before = out.find_last_not_of(' ');
        auto after = s.find_first_not_of(' ', k + 1);
        if (before != std::string::npos && after != std::string::npos && is_number_char(out[before]) &&
            is_number_char(s[after])) {
          out.erase(before + 1);
          i = after - 1;
        } else {
          out += ',';
          i = k;
        }
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// "1000,99", "1,22", "0,111": one comma that cannot separate thousands (two
// digits after it, four or more, or a lone 0 before it) is a decimal comma.
std::string decimal_comma(const std::string& s) {
  auto comma = s.find(',');
  if (comma == std::string::npos || s.find(',', comma + 1) != std::string::npos || s.find('.') != std::string::npos)
    return s;
  size_t start = !s.empty() && s[0] == '-' ? 1 : 0;
  auto before = s.substr(start, comma - start), after = s.substr(comma + 1);
  auto digits = [](const std::string& x) {
    return !x.empty() && std::all_of(x.begin(), x.end(), [](char c) { return is_number_char(c); });
  };
  if (!digits(before) || !digits(after))
    return s;
  if (after.size() == 2 || after.size() >= 4 || before == "0")
    return s.substr(0, comma) + "." + after;
  return s;
}

// Number followed by words ("5 cm", "12 apples", "3 \text{dollars}" after unwrapping): keep the number.
// Not when the words qualify it ("12 or more", "at least 5"): then it is no plain number.
std::string drop_trailing_units(const std::string& s) {
  auto space = s.find(' ');
  if (space == std::string::npos)
    return s;
  auto head = s.substr(0, space);
  auto rest = trim(std::string_view{s}.substr(space));
  bool words = !rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == ' ' || c == '^' || c == '.';
  });
  static const char* qualifiers[] = {"or",     "and",  "more",  "less", "least", "most",    "than",
                                     "not",    "no",   "fewer", "over", "under", "greater", "smaller",
                                     "larger", "only", "about", "up",   "to",    "exactly", "approximately"};
  auto lower = lowercase(" " + rest + " ");
  for (auto q : qualifiers)
    if (lower.find(" " + std::string{q} + " ") != std::string::npos)
      return s;
  if (words && parse_rational(drop_thousands_separators(head)))
    return head;
  return s;
}

}  // namespace

std::string normalize_math_answer(std::string_view answer) {
  std::string s{answer.substr(0, 4096)};
  replace_all(s, "\xe2\x88\x92", "-");  // Unicode minus
  // A doubled backslash before a command name is an escaping slip ("\\\\frac"), not a row break;
  // three ("0\\\\\\end") are a row break before a command.
  for (size_t pos = s.find("\\\\"); pos != std::string::npos; pos = s.find("\\\\", pos + 1))
    if (pos + 2 < s.size() && std::isalpha(static_cast<unsigned char>(s[pos + 2])) && (pos == 0 || s[pos - 1] != '\\'))
      s.erase(pos, 1);
  // "(11,7)or(7,11)": a list.
  replace_all(s, ")or(", "), (");
  replace_all(s, ")and(", "), (");
  replace_all(s, "\xc2\xb0", "");  // degree sign
  // Thousands marked as such: "14{,}916", "14 {, }916", "32,\! 349".
  s = without_braced_thousands_commas(s);
  for (size_t pos = s.find(",\\!"); pos != std::string::npos; pos = s.find(",\\!", pos)) {
    auto next = pos + 3;
    while (next < s.size() && s[next] == ' ')
      ++next;
    if (pos > 0 && next < s.size() && is_number_char(s[pos - 1]) && is_number_char(s[next]))
      s.erase(pos, next - pos);
    else
      ++pos;
  }
  for (auto spacing : {"\\left", "\\right", "\\displaystyle", "\\!"})
    replace_command(s, spacing, "");
  replace_all(s, "\\!", "");
  for (auto space : {"\\qquad", "\\quad"})  // also "\\quadx", as written in some references
    replace_all(s, space, " ");
  replace_all(s, "\\\\", "\x01");  // a row break, not a backslash before a space
  for (auto space : {"\\,", "\\;", "\\:", "\\ ", "~"})
    replace_all(s, space, " ");
  replace_all(s, "\x01", "\\\\");
  replace_all(s, "\\$", "");
  replace_all(s, "$", "");
  for (auto wrapper : {"\\boxed", "\\text", "\\textbf", "\\textnormal", "\\textit", "\\textrm", "\\mathrm", "\\mathbf",
                       "\\mathit", "\\mbox", "\\operatorname", "\\fbox"})
    unwrap_command(s, wrapper);
  replace_all(s, "^{\\circ}", "");
  replace_all(s, "^\\circ", "");
  replace_command(s, "\\circ", "");
  replace_all(s, "\\%", "%");
  for (auto word : {" percentage", " percent", " pct", "percentage", "percent", "pct"})
    replace_all(s, word, "%");
  // Relations, sets and signs, one spelling each.
  for (auto [from, to] :
       {std::pair{"\\geqslant", "\xe2\x89\xa5"}, std::pair{"\\leqslant", "\xe2\x89\xa4"},
        std::pair{"\\geq", "\xe2\x89\xa5"}, std::pair{"\\leq", "\xe2\x89\xa4"}, std::pair{"\\ge", "\xe2\x89\xa5"},
        std::pair{"\\le", "\xe2\x89\xa4"}, std::pair{"\\neq", "\xe2\x89\xa0"}, std::pair{"\\ne", "\xe2\x89\xa0"},
        std::pair{"\\approx", "\xe2\x89\x88"}, std::pair{"\\lt", "<"}, std::pair{"\\gt", ">"},
        std::pair{"\\infty", "\xe2\x88\x9e"}, std::pair{"\\cup", "\xe2\x88\xaa"}, std::pair{"\\in", "\xe2\x88\x88"},
        std::pair{"\\pm", "\xc2\xb1"}, std::pair{"\\{", "\xe2\xa6\x83"}, std::pair{"\\}", "\xe2\xa6\x84"}}) {
    if (from[1] == '{' || from[1] == '}')
      replace_all(s, from, to);
    else
      replace_command(s, from, to);
  }
  for (auto [from, to] :
       {std::pair{">=", "\xe2\x89\xa5"}, std::pair{"<=", "\xe2\x89\xa4"}, std::pair{"!=", "\xe2\x89\xa0"}})
    replace_all(s, from, to);
  replace_all(s, "\\cfrac", "\\frac");
  rewrite_fractions(s);
  // "\sqrt3" -> "\sqrt{3}"
  for (size_t pos = find_command(s, "\\sqrt"); pos != std::string::npos; pos = find_command(s, "\\sqrt", pos + 1))
    if (pos + 5 < s.size() && s[pos + 5] != '{' && s[pos + 5] != '[' && s[pos + 5] != ' ')
      s.insert(pos + 6, "}").insert(pos + 5, "{");
  // Whitespace: one space at most, none at the ends.
  std::string collapsed;
  for (char c : s) {
    bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (space && (collapsed.empty() || collapsed.back() == ' '))
      continue;
    collapsed += space ? ' ' : c;
  }
  s = trim(collapsed);
  while (!s.empty() && (s.back() == '.' || s.back() == ' '))
    s.pop_back();
  s = drop_trailing_units(s);
  if (s.find(' ') == std::string::npos)
    s = drop_thousands_separators(decimal_comma(s));
  if (s.size() >= 2 && s.front() == '{' && s.back() == '}' && brace_group(s, 0) &&
      brace_group(s, 0)->second == s.size())
    s = trim(s.substr(1, s.size() - 2));
  return s;
}

verification verify_math(std::string_view response, const std::vector<std::string>& references,
                         const math_options& options) {
  auto answers = extract_math_answers(response, options.unmarked_fallback, options.last_number_is_answer);
  if (answers.empty())
    return {verdict::no_answer, 0.0f,
            std::string{"no final answer found (no \\boxed{}, no \"the answer is\", not a bare answer"} +
                (options.unmarked_fallback ? ", no math, no number)" : "; the unmarked-answer fallback is off)")};
  // Several boxed answers: the list of them where the reference is a list, else the last.
  std::string list;
  for (auto& a : answers)
    list += (list.empty() ? "" : ", ") + a;
  auto last = normalize_math_answer(answers.back());
  auto all = normalize_math_answer(list);
  math::comparison_options compare{options.relative_tolerance, options.chain_answers_interval};
  for (auto& reference : references) {
    auto ref = normalize_math_answer(reference);
    for (auto* candidate :
         answers.size() > 1 ? std::vector<const std::string*>{&all, &last} : std::vector<const std::string*>{&last}) {
      std::string why;
      if (math::equivalent(*candidate, ref, compare, why))
        return {verdict::correct, 1.0f, "answer \"" + *candidate + "\" equals reference \"" + ref + "\" (" + why + ")"};
    }
  }
  return {verdict::wrong, 0.0f,
          "answer \"" + (answers.size() > 1 ? all : last) + "\" matches none of " + std::to_string(references.size()) +
              " reference(s)"};
}

}  // namespace areal::reward
