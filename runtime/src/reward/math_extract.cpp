// Math answers: finding the final answer of a response (see extract_math_answers in verifiers.hpp).
#include <algorithm>
#include <cctype>

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

using text::brace_group;
using text::is_number_char;
using text::lowercase;

// "%" when the text right after a boxed answer says it is a percentage ("$\boxed{20}$ percent").
std::string percent_after(std::string_view after) {
  auto lower = lowercase(std::string{after.substr(0, 16)});
  auto at = lower.find_first_not_of(" $");
  if (at == std::string::npos)
    return "";
  for (auto word : {"percent", "\\%", "%"})
    if (lower.compare(at, std::string_view{word}.size(), word) == 0)
      return "%";
  return "";
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
          found.push_back({pos, group->second, content + percent_after(s.substr(group->second))});
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
  // An unclosed "$" ("Soucis : 2,74 $ a..") is no well-formed answer.
  size_t dollars = 0;
  for (size_t i = 0; i < s.size(); ++i)
    dollars += s[i] == '$' && (i == 0 || s[i - 1] != '\\');
  if (dollars % 2 != 0)
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

// A piece of the text found by a scan, and where it ends.
struct found_text {
  std::string text;
  size_t end;
};

std::optional<found_text> last_number(std::string_view s);

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
        return number->text;
  }
  return answer.empty() ? std::nullopt : std::optional<std::string>{answer};
}

// The last math segment of the text ($...$, $$...$$, \(...\), \[...\]), not empty.
std::optional<found_text> last_math(std::string_view s) {
  std::optional<found_text> last;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '$' && !(s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == '(' || s[i + 1] == '[')))
      continue;
    if (s[i] == '$' && i > 0 && s[i - 1] == '\\')
      continue;
    auto math = leading_math(s.substr(i));
    if (!math)
      continue;
    // Past the segment: find its closing delimiter after the content.
    auto close = s.find(*math, i);
    i = close == std::string_view::npos ? i : close + math->size();
    while (i + 1 < s.size() && (s[i + 1] == '$' || s[i + 1] == ')' || s[i + 1] == ']' || s[i + 1] == '\\'))
      ++i;
    if (!math->empty())
      last = found_text{*math, i + 1};
  }
  return last;
}

// The last number of the text that stands alone (not inside a word such as "AZYUK2A").
std::optional<found_text> last_number(std::string_view s) {
  std::optional<found_text> last;
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
    // Inside a word ("AZYUK2A") when a letter comes before it; letters after it may be a unit ("1,000.99m").
    bool in_word = start > 0 && std::isalpha(static_cast<unsigned char>(s[start - 1]));
    if (!in_word)
      last = found_text{std::string{s.substr(start, i - start)}, i};
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
    // "Final Answer: The final answer is $10,455$" after the boxes: the response's last word on it.
    auto after = s.substr(boxed.back().end);
    constexpr std::string_view final_marker = "final answer is";
    if (auto at = lowercase(std::string{after}).rfind(final_marker); at != std::string::npos)
      if (auto math = leading_math(trim(after.substr(at + final_marker.size()))); math && !math->empty())
        return {*math};
    std::vector<std::string> out;
    for (size_t i = first; i < boxed.size(); ++i)
      out.push_back(boxed[i].content);
    return out;
  }
  if (auto marked = after_answer_marker(s))
    return {*marked};
  if (last_number_is_answer)
    if (auto number = last_number(s))
      return {number->text};
  if (auto bare = bare_answer(s))
    return {*bare};
  if (unmarked_fallback) {
    // Whichever comes last: the last math, or a number standing alone after it.
    auto math = last_math(s);
    auto number = last_number(s.substr(math ? math->end : 0));
    if (number)
      return {number->text};
    if (math)
      return {math->text};
  }
  return {};
}

}  // namespace areal::reward
