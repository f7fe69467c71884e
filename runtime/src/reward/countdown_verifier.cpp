// Countdown answers: a small recursive-descent parser with exact arithmetic.
//   expression := term (('+' | '-') term)*
//   term       := factor (('*' | '/') factor)*
//   factor     := integer | '(' expression ')'
// Unary minus is not allowed: it would make numbers that were not given.
#include <algorithm>
#include <cctype>
#include <map>

#include "areal/reward/verifiers.hpp"
#include "text.hpp"

namespace areal::reward {

namespace {

class parser {
 public:
  parser(std::string_view text, std::vector<long long>* used, const countdown_options& options)
      : s_(text), used_(used), options_(options) {}

  evaluation run() {
    auto v = expression(0);
    skip_spaces();
    if (!error_.empty())
      return {std::nullopt, error_};
    if (pos_ != s_.size())
      return {std::nullopt, "unexpected '" + std::string(1, s_[pos_]) + "' at position " + std::to_string(pos_)};
    return {v, {}};
  }

 private:
  std::optional<rational> fail(std::string why) {
    if (error_.empty())
      error_ = std::move(why);
    return std::nullopt;
  }

  void skip_spaces() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_])))
      ++pos_;
  }

  bool accept(char c) {
    skip_spaces();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::optional<rational> expression(int depth) {
    auto left = term(depth);
    while (left) {
      if (accept('+')) {
        auto right = term(depth);
        if (!right)
          return std::nullopt;
        left = left->add(*right);
        if (!left)
          return fail("overflow");
      } else if (accept('-')) {
        auto right = term(depth);
        if (!right)
          return std::nullopt;
        left = left->subtract(*right);
        if (!left)
          return fail("overflow");
      } else {
        break;
      }
    }
    return left;
  }

  std::optional<rational> term(int depth) {
    auto left = factor(depth);
    while (left) {
      bool times = accept('*');
      bool over = !times && accept('/');
      if (!times && !over)
        break;
      auto right = factor(depth);
      if (!right)
        return std::nullopt;
      if (over && right->is_zero())
        return fail("division by zero");
      left = times ? left->multiply(*right) : left->divide(*right);
      if (!left)
        return fail("overflow");
    }
    return left;
  }

  std::optional<rational> factor(int depth) {
    skip_spaces();
    if (pos_ >= s_.size())
      return fail("expression ends where a number or '(' was expected");
    if (accept('(')) {
      if (depth + 1 > options_.max_depth)
        return fail("parentheses nested deeper than " + std::to_string(options_.max_depth));
      auto inner = expression(depth + 1);
      if (!inner)
        return std::nullopt;
      if (!accept(')'))
        return fail("missing ')'");
      return inner;
    }
    if (!std::isdigit(static_cast<unsigned char>(s_[pos_])))
      return fail("unexpected '" + std::string(1, s_[pos_]) + "' at position " + std::to_string(pos_) +
                  " (only integers, + - * / and parentheses)");
    long long value = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      if (__builtin_mul_overflow(value, 10LL, &value) || __builtin_add_overflow(value, s_[pos_] - '0', &value))
        return fail("number too large");
      ++pos_;
    }
    if (used_)
      used_->push_back(value);
    return rational::integer(value);
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::vector<long long>* used_;
  const countdown_options& options_;
  std::string error_;
};

using text::trim;

std::string list(const std::vector<long long>& xs) {
  std::string out;
  for (auto x : xs)
    out += (out.empty() ? "" : ", ") + std::to_string(x);
  return "[" + out + "]";
}

}  // namespace

std::optional<std::string> extract_countdown_expression(std::string_view response) {
  if (response.size() > 64 * 1024)
    response = response.substr(response.size() - 64 * 1024);
  std::string found;
  auto open = response.rfind("<answer>");
  if (open != std::string_view::npos) {
    auto close = response.find("</answer>", open);
    found =
        trim(response.substr(open + 8, close == std::string_view::npos ? std::string_view::npos : close - open - 8));
  } else if (auto boxed = response.rfind("\\boxed{"); boxed != std::string_view::npos) {
    int depth = 0;
    size_t end = boxed + 6;
    for (; end < response.size(); ++end) {
      if (response[end] == '{')
        ++depth;
      else if (response[end] == '}' && --depth == 0)
        break;
    }
    found = trim(response.substr(boxed + 7, end - boxed - 7));
  } else if (auto marker = response.rfind("answer is"); marker != std::string_view::npos) {
    auto rest = response.substr(marker + 9);
    found = trim(rest.substr(0, rest.find('\n')));
    while (!found.empty() && (found.front() == ':' || found.back() == '.'))
      found = trim(found.front() == ':' ? found.substr(1) : found.substr(0, found.size() - 1));
  } else {
    auto end = response.find_last_not_of(" \t\r\n");
    if (end == std::string_view::npos)
      return std::nullopt;
    auto start = response.rfind('\n', end);
    found = trim(response.substr(start == std::string_view::npos ? 0 : start + 1,
                                 end + 1 - (start == std::string_view::npos ? 0 : start + 1)));
  }
  if (auto eq = found.find('='); eq != std::string::npos)
    found = trim(std::string_view{found}.substr(0, eq));
  if (found.empty())
    return std::nullopt;
  return found;
}

evaluation evaluate_expression(std::string_view expression, std::vector<long long>* used,
                               const countdown_options& options) {
  if (expression.size() > options.max_expression_chars)
    return {std::nullopt, "expression longer than " + std::to_string(options.max_expression_chars) + " characters"};
  // Multiplication and division signs as models write them.
  std::string text{expression};
  for (auto [from, to] : {std::pair<std::string_view, std::string_view>{"\\times", "*"},
                          {"\\cdot", "*"},
                          {"\\div", "/"},
                          {"\xc3\x97", "*"},
                          {"\xc3\xb7", "/"},
                          {"\xe2\x88\x92", "-"}}) {
    for (size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos))
      text.replace(pos, from.size(), to);
  }
  return parser{text, used, options}.run();
}

verification verify_countdown(std::string_view response, const std::vector<long long>& numbers, long long target,
                              const countdown_options& options) {
  auto expression = extract_countdown_expression(response);
  if (!expression)
    return {verdict::no_answer, 0.0f, "no expression found"};
  std::vector<long long> used;
  auto result = evaluate_expression(*expression, &used, options);
  if (!result.value)
    return {verdict::wrong, 0.0f, "\"" + *expression + "\": " + result.error};
  std::map<long long, int> available;
  for (auto n : numbers)
    ++available[n];
  for (auto n : used)
    if (--available[n] < 0)
      return {verdict::wrong, 0.0f,
              "\"" + *expression + "\" uses " + std::to_string(n) + " more often than given in " + list(numbers)};
  if (options.use_all_numbers && used.size() != numbers.size())
    return {verdict::wrong, 0.0f,
            "\"" + *expression + "\" uses " + std::to_string(used.size()) + " of the " +
                std::to_string(numbers.size()) + " numbers; all must be used"};
  auto want = rational::integer(target);
  if (!(*result.value == want))
    return {verdict::wrong, 0.0f,
            "\"" + *expression + "\" = " + result.value->to_string() + ", target " + std::to_string(target)};
  return {verdict::correct, 1.0f, "\"" + *expression + "\" = " + std::to_string(target)};
}

}  // namespace areal::reward
