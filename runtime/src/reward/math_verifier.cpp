// Math answers: extraction, normalization and comparison.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "areal/reward/verifiers.hpp"
#include "text.hpp"

namespace areal::reward {

namespace {

// Responses are scanned from their end; a final answer lies in the tail.
constexpr size_t max_scanned_chars = 64 * 1024;

std::string_view tail(std::string_view s) {
  return s.size() > max_scanned_chars ? s.substr(s.size() - max_scanned_chars) : s;
}

using text::trim;

// Content of the brace group opening at s[open] == '{', or nullopt when unbalanced.
std::optional<std::pair<std::string, size_t>> brace_group(std::string_view s, size_t open) {
  if (open >= s.size() || s[open] != '{')
    return std::nullopt;
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{')
      ++depth;
    else if (s[i] == '}' && --depth == 0)
      return std::make_pair(std::string{s.substr(open + 1, i - open - 1)}, i + 1);
  }
  return std::nullopt;
}

bool is_number_char(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

std::string lowercase(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty())
    return;
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

// "\name{X}" -> "X" for every occurrence (nested groups kept intact).
void unwrap_command(std::string& s, std::string_view name) {
  for (size_t pos = s.find(name); pos != std::string::npos; pos = s.find(name, pos)) {
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

// Number followed by words ("5 cm", "12 apples", "3 \text{dollars}" after unwrapping): keep the number.
std::string drop_trailing_units(const std::string& s) {
  auto space = s.find(' ');
  if (space == std::string::npos)
    return s;
  auto head = s.substr(0, space);
  auto rest = trim(std::string_view{s}.substr(space));
  bool words = !rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == ' ' || c == '^' || c == '.';
  });
  if (words && parse_rational(drop_thousands_separators(head)))
    return head;
  return s;
}

}  // namespace

std::optional<std::string> extract_math_answer(std::string_view full) {
  auto s = tail(full);
  // 1. The last \boxed{...} (or \fbox{...}).
  for (auto command : {std::string_view{"\\boxed"}, std::string_view{"\\fbox"}}) {
    auto pos = s.rfind(command);
    if (pos == std::string_view::npos)
      continue;
    auto at = pos + command.size();
    while (at < s.size() && s[at] == ' ')
      ++at;
    if (auto group = brace_group(s, at)) {
      auto content = trim(group->first);
      if (!content.empty())
        return content;
    } else if (at < s.size()) {  // "\boxed 5"
      auto end = s.find_first_of(" $\n", at);
      auto content = trim(s.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
      if (!content.empty())
        return content;
    }
  }
  // 2. After the last "the answer is" / "answer:".
  auto lower = lowercase(std::string{s});
  for (auto marker : {std::string_view{"answer is"}, std::string_view{"answer:"}}) {
    auto pos = lower.rfind(marker);
    if (pos == std::string::npos)
      continue;
    auto rest = s.substr(pos + marker.size());
    auto line_end = rest.find('\n');
    auto line = rest.substr(0, line_end);
    // End of sentence: a period followed by a space ("... is 5. Done").
    auto sentence_end = line.find(". ");
    line = line.substr(0, sentence_end);
    auto answer = trim(line);
    while (!answer.empty() && (answer.front() == ':' || answer.front() == ' '))
      answer.erase(answer.begin());
    if (!answer.empty())
      return answer;
  }
  // 3. The last number (with sign, decimals, thousands separators or a fraction bar).
  std::optional<std::string> last;
  for (size_t i = 0; i < s.size();) {
    if (!is_number_char(s[i])) {
      ++i;
      continue;
    }
    size_t start = i;
    if (start > 0 && s[start - 1] == '-')
      --start;
    while (i < s.size() && (is_number_char(s[i]) || ((s[i] == ',' || s[i] == '.' || s[i] == '/') && i + 1 < s.size() &&
                                                     is_number_char(s[i + 1]))))
      ++i;
    last = std::string{s.substr(start, i - start)};
  }
  return last;
}

std::string normalize_math_answer(std::string_view answer) {
  std::string s{answer.substr(0, 1024)};
  replace_all(s, "\xe2\x88\x92", "-");  // Unicode minus
  replace_all(s, "\xc2\xb0", "");       // degree sign
  for (auto spacing : {"\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "\\$", "$", "~"})
    replace_all(s, spacing, "");
  replace_all(s, "\\ ", " ");
  for (auto wrapper : {"\\boxed", "\\text", "\\textbf", "\\mathrm", "\\mathbf", "\\mbox"})
    unwrap_command(s, wrapper);
  replace_all(s, "^{\\circ}", "");
  replace_all(s, "^\\circ", "");
  replace_all(s, "\\circ", "");
  replace_all(s, "\\%", "");
  replace_all(s, "%", "");
  replace_all(s, "{,}", ",");
  rewrite_fractions(s);
  s = trim(s);
  while (!s.empty() && (s.back() == '.' || s.back() == ' '))
    s.pop_back();
  // "x = 5" -> "5"
  if (s.size() > 2 && std::isalpha(static_cast<unsigned char>(s[0]))) {
    auto eq = s.find('=');
    if (eq != std::string::npos && trim(std::string_view{s}.substr(1, eq - 1)).empty())
      s = trim(std::string_view{s}.substr(eq + 1));
  }
  s = drop_trailing_units(s);
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
          s.end());
  s = drop_thousands_separators(s);
  // "(3)/(4)" of simple fractions -> "3/4"; "{5}" -> "5"
  if (s.size() >= 2 && s.front() == '{' && s.back() == '}')
    s = s.substr(1, s.size() - 2);
  return lowercase(s);
}

verification verify_math(std::string_view response, const std::vector<std::string>& references,
                         const math_options& options) {
  auto extracted = extract_math_answer(response);
  if (!extracted)
    return {verdict::no_answer, 0.0f, "no final answer found (no \\boxed{}, no \"the answer is\", no number)"};
  auto answer = normalize_math_answer(*extracted);
  bool answer_decimal = false;
  auto answer_value = parse_rational(answer, &answer_decimal);
  for (auto& reference : references) {
    auto ref = normalize_math_answer(reference);
    bool ref_decimal = false;
    auto ref_value = parse_rational(ref, &ref_decimal);
    bool equal = false;
    if (answer_value && ref_value) {
      if (!answer_decimal && !ref_decimal) {
        equal = *answer_value == *ref_value;
      } else {
        auto a = answer_value->approx();
        auto b = ref_value->approx();
        equal =
            std::fabs(static_cast<double>(a - b)) <=
            options.relative_tolerance * std::max(std::fabs(static_cast<double>(a)), std::fabs(static_cast<double>(b)));
      }
    } else {
      equal = !answer.empty() && answer == ref;
    }
    if (equal)
      return {verdict::correct, 1.0f, "answer \"" + answer + "\" equals reference \"" + ref + "\""};
  }
  return {verdict::wrong, 0.0f,
          "answer \"" + answer + "\" matches none of " + std::to_string(references.size()) + " reference(s)"};
}

}  // namespace areal::reward
