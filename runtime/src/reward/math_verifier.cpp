// Math answers: extraction and normalization; the comparison is math_compare.cpp.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "areal/reward/verifiers.hpp"
#include "math_compare.hpp"
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

// One \boxed{...} (or \fbox{...}) of a response: its content and where it starts and ends.
struct boxed_answer {
  size_t start, end;
  std::string content;
};

// Every \boxed{...} and \fbox{...} of `s`, in order.
std::vector<boxed_answer> boxed_answers(std::string_view s) {
  std::vector<boxed_answer> found;
  for (auto command : {std::string_view{"\\boxed"}, std::string_view{"\\fbox"}}) {
    for (size_t pos = s.find(command); pos != std::string_view::npos; pos = s.find(command, pos + 1)) {
      auto at = pos + command.size();
      while (at < s.size() && s[at] == ' ')
        ++at;
      if (auto group = brace_group(s, at)) {
        auto content = trim(group->first);
        if (!content.empty())
          found.push_back({pos, group->second, content});
      } else if (at < s.size() && at > pos + command.size()) {  // "\boxed 5"
        auto end = s.find_first_of(" $\n", at);
        end = end == std::string_view::npos ? s.size() : end;
        auto content = trim(s.substr(at, end - at));
        if (!content.empty())
          found.push_back({pos, end, content});
      }
    }
  }
  std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.start < b.start; });
  return found;
}

// Boxed answers written as one list: what lies between them is short and joins them
// ("\boxed{1}, \boxed{2}", "\boxed{6} and \boxed{8}"), not "first \boxed{1} then \boxed{2}".
bool joins(std::string_view between) {
  if (between.size() > 40)
    return false;
  if (trim(between).find_first_not_of("$ ") == std::string::npos)  // "\boxed{1}\boxed{2}"
    return true;
  auto lower = lowercase(" " + std::string{between} + " ");
  for (auto& c : lower)
    if (c == '$' || c == '\\' || c == '{' || c == '}' || c == '(' || c == ')' || c == '[' || c == ']')
      c = ' ';
  return lower.find(',') != std::string::npos || lower.find(';') != std::string::npos ||
         lower.find(" and ") != std::string::npos || lower.find(" or ") != std::string::npos;
}

// The first math segment of `s` if `s` starts with one: "$x$", "$$x$$", "\(x\)", "\[x\]".
std::optional<std::string> leading_math(std::string_view s) {
  for (auto [open, close] :
       {std::pair{"$$", "$$"}, std::pair{"\\[", "\\]"}, std::pair{"\\(", "\\)"}, std::pair{"$", "$"}}) {
    std::string_view o{open}, c{close};
    if (s.substr(0, o.size()) != o)
      continue;
    auto end = s.find(c, o.size());
    while (end != std::string_view::npos && c == "$" && s[end - 1] == '\\')  // "\$": a dollar sign, not the end
      end = s.find(c, end + 1);
    if (end == std::string_view::npos)
      return std::nullopt;
    auto raw = s.substr(o.size(), end - o.size());
    // Inline math does not run across lines.
    if ((o == "$" || o == "\\(") && raw.find('\n') != std::string_view::npos)
      return std::nullopt;
    return trim(raw);
  }
  return std::nullopt;
}

// A response that is nothing but one answer: short, and no sentence outside math and \text.
std::optional<std::string> bare_answer(std::string_view response) {
  auto s = trim(response);
  if (s.empty() || s.size() > 200)
    return std::nullopt;
  if (auto math = leading_math(s)) {
    auto after = trim(std::string_view{s}.substr(std::min(s.size(), s.find(*math) + math->size())));
    if (after.size() <= 2)  // the closing delimiter and perhaps a period
      return math;
  }
  // Words (two letters or more) outside \commands: three make a sentence, not an answer.
  int words = 0, letters = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    char c = i < s.size() ? s[i] : ' ';
    if (c == '\\') {
      while (i + 1 < s.size() && std::isalpha(static_cast<unsigned char>(s[i + 1])))
        ++i;
      letters = 0;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c))) {
      ++letters;
      continue;
    }
    words += letters >= 2;
    letters = 0;
  }
  if (words >= 3)
    return std::nullopt;
  return s;
}

std::optional<std::string> last_number(std::string_view s);

// The math or the sentence after the last "answer is" or "answer:" (case-insensitive).
std::optional<std::string> after_answer_marker(std::string_view s) {
  auto lower = lowercase(std::string{s});
  size_t best = std::string::npos, best_end = 0;
  for (auto marker : {std::string_view{"answer is"}, std::string_view{"answer:"}, std::string_view{"answer"}}) {
    auto pos = lower.rfind(marker);
    if (pos == std::string::npos)
      continue;
    auto end = pos + marker.size();
    // A bare "answer" counts only when math follows it at once ("Answer $9$").
    if (marker == "answer") {
      auto rest = trim(std::string_view{s}.substr(end));
      if (!leading_math(rest))
        continue;
    }
    if (best == std::string::npos || pos > best) {
      best = pos;
      best_end = end;
    }
  }
  if (best == std::string::npos)
    return std::nullopt;
  auto rest = std::string{trim(s.substr(best_end))};
  while (!rest.empty() && (rest.front() == ':' || rest.front() == ' '))
    rest.erase(rest.begin());
  if (auto math = leading_math(rest))
    return math->empty() ? std::nullopt : math;
  auto line = rest.substr(0, rest.find('\n'));
  line = line.substr(0, line.find(". "));  // the end of the sentence
  // "The largest $n$ is 34": what the sentence says the answer is.
  if (auto is = lowercase(line).rfind(" is "); is != std::string::npos)
    line = line.substr(is + 4);
  if (auto math = leading_math(trim(line)))
    return math->empty() ? std::nullopt : math;
  auto answer = trim(line);
  // "Jane started growing Sphere 3 hours ago": a sentence with one number answers with it.
  if (!bare_answer(answer)) {
    int numbers = 0;
    for (size_t i = 0; i < answer.size(); ++i)
      if (is_number_char(answer[i]) &&
          (i == 0 || (!is_number_char(answer[i - 1]) && answer[i - 1] != '.' && answer[i - 1] != ',')))
        ++numbers;
    if (numbers == 1)
      if (auto number = last_number(answer))
        return number;
  }
  return answer.empty() ? std::nullopt : std::optional<std::string>{answer};
}

// The last math segment of the text ($...$, $$...$$, \(...\), \[...\]), not empty.
std::optional<std::string> last_math(std::string_view s) {
  std::optional<std::string> last;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '$' && !(s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == '(' || s[i + 1] == '[')))
      continue;
    if (s[i] == '$' && i > 0 && s[i - 1] == '\\')
      continue;
    auto math = leading_math(s.substr(i));
    if (!math)
      continue;
    if (!math->empty())
      last = math;
    // Past the segment: find its closing delimiter after the content.
    auto close = s.find(*math, i);
    i = close == std::string_view::npos ? i : close + math->size();
    while (i + 1 < s.size() && (s[i + 1] == '$' || s[i + 1] == ')' || s[i + 1] == ']' || s[i + 1] == '\\'))
      ++i;
  }
  return last;
}

// The last number of the text that stands alone (not inside a word such as "AZYUK2A").
std::optional<std::string> last_number(std::string_view s) {
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
    bool in_word = (start > 0 && std::isalpha(static_cast<unsigned char>(s[start - 1]))) ||
                   (i < s.size() && std::isalpha(static_cast<unsigned char>(s[i])));
    if (!in_word)
      last = std::string{s.substr(start, i - start)};
  }
  return last;
}

}  // namespace

std::vector<std::string> extract_math_answers(std::string_view full, bool unmarked_fallback,
                                              bool last_number_is_answer) {
  auto s = tail(full);
  if (auto boxed = boxed_answers(s); !boxed.empty()) {
    // The last boxed answer, with those before it that the text joins to it as one list.
    size_t first = boxed.size() - 1;
    while (first > 0 && joins(s.substr(boxed[first - 1].end, boxed[first].start - boxed[first - 1].end)))
      --first;
    std::vector<std::string> out;
    for (size_t i = first; i < boxed.size(); ++i)
      out.push_back(boxed[i].content);
    return out;
  }
  if (auto marked = after_answer_marker(s))
    return {*marked};
  if (last_number_is_answer)
    if (auto number = last_number(s))
      return {*number};
  if (auto bare = bare_answer(s))
    return {*bare};
  if (unmarked_fallback) {
    if (auto math = last_math(s))
      return {*math};
    if (auto number = last_number(s))
      return {*number};
  }
  return {};
}

std::string normalize_math_answer(std::string_view answer) {
  std::string s{answer.substr(0, 4096)};
  replace_all(s, "\xe2\x88\x92", "-");  // Unicode minus
  // A doubled backslash before a command name is an escaping slip ("\\\\frac"), not a row break.
  for (size_t pos = s.find("\\\\"); pos != std::string::npos; pos = s.find("\\\\", pos + 1))
    if (pos + 2 < s.size() && std::isalpha(static_cast<unsigned char>(s[pos + 2])))
      s.erase(pos, 1);
  // "(11,7)or(7,11)": a list.
  replace_all(s, ")or(", "), (");
  replace_all(s, ")and(", "), (");
  replace_all(s, "\xc2\xb0", "");  // degree sign
  // Thousands marked as such: "14{,}916", "32,\! 349".
  for (size_t pos = s.find("{,}"); pos != std::string::npos; pos = s.find("{,}", pos))
    s.replace(pos, 3,
              pos > 0 && pos + 3 < s.size() && is_number_char(s[pos - 1]) && is_number_char(s[pos + 3]) ? "" : ",");
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
    s = drop_thousands_separators(s);
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
  math::comparison_options compare{options.relative_tolerance};
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
