// LaTeX scalars read into GiNaC expressions and compared (see math_expression.hpp).
#include "math_expression.hpp"

#include "cas_process.hpp"

#include <ginac/ginac.h>

#include <cctype>
#include <cmath>
#include <mutex>
#include <set>
#include <vector>

namespace areal::reward::math {

namespace {

constexpr size_t max_chars = 400;
constexpr size_t max_digits = 40;
constexpr int max_depth = 40;
constexpr long max_exponent = 1000;

bool is_letter(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0;
}
bool is_digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

// Recursive-descent rewriting of LaTeX into GiNaC's parser syntax. Every
// operand is emitted in parentheses, and products written by juxtaposition
// ("2x", "3\sqrt{13}", "(a+5)(b+2)") get an explicit '*'.
class reader {
 public:
  explicit reader(std::string_view s) : s_{s} {}

  std::optional<std::string> run() {
    auto out = sequence('\0');
    if (!out || i_ != s_.size() || out->empty())
      return std::nullopt;
    return out;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
  int depth_ = 0;

  void skip_spaces() {
    while (i_ < s_.size() && s_[i_] == ' ')
      ++i_;
  }

  bool take(std::string_view word) {
    if (s_.substr(i_, word.size()) != word)
      return false;
    i_ += word.size();
    return true;
  }

  // A command's name after the backslash: letters only.
  std::string command() {
    size_t start = i_;
    while (i_ < s_.size() && is_letter(s_[i_]))
      ++i_;
    return std::string{s_.substr(start, i_ - start)};
  }

  // Operands and operators up to `end` (a closing bracket, or '\0' for the end of the text).
  std::optional<std::string> sequence(char end) {
    if (++depth_ > max_depth)
      return std::nullopt;
    std::string out;
    bool operand_before = false, any_operand = false;
    while (true) {
      skip_spaces();
      if (i_ >= s_.size()) {
        if (end != '\0')
          return std::nullopt;
        break;
      }
      char c = s_[i_];
      if (c == end) {
        ++i_;
        break;
      }
      if (c == '+' || c == '-' || c == '*' || c == '/') {
        out += c;
        ++i_;
        operand_before = false;
        continue;
      }
      if (c == '^') {
        if (!operand_before)
          return std::nullopt;
        ++i_;
        auto exponent = power_operand();
        if (!exponent)
          return std::nullopt;
        out += "^(" + *exponent + ")";
        continue;
      }
      auto operand = atom();
      if (!operand)
        return std::nullopt;
      if (operand_before)
        out += "*";
      out += "(" + *operand + ")";
      operand_before = true;
      any_operand = true;
    }
    --depth_;
    // Nothing but operators, or nothing at all ("\sqrt{}"): no expression. GiNaC's
    // parser dereferences a null pointer on a call without arguments ("sqrt()").
    if (!any_operand)
      return std::nullopt;
    return out;
  }

  // The exponent after '^': a group or one character; no towers, plain numbers bounded.
  std::optional<std::string> power_operand() {
    skip_spaces();
    std::optional<std::string> e;
    size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '{') {
      ++i_;
      e = sequence('}');
    } else if (i_ < s_.size() && s_[i_] == '(') {
      ++i_;
      e = sequence(')');
    } else if (i_ < s_.size() && (is_digit(s_[i_]) || is_letter(s_[i_]))) {
      e = std::string(1, s_[i_++]);
    } else if (i_ < s_.size() && s_[i_] == '\\') {
      e = atom();
    }
    if (!e || e->find('^') != std::string::npos)
      return std::nullopt;
    // A plain number as exponent: at most max_exponent.
    std::string digits;
    for (char c : s_.substr(start, i_ - start))
      if (is_digit(c))
        digits += c;
      else if (c != '{' && c != '}' && c != '(' && c != ')' && c != '-' && c != ' ')
        return e;
    if (!digits.empty() && (digits.size() > 4 || std::stol(digits) > max_exponent))
      return std::nullopt;
    return e;
  }

  std::optional<std::string> group_argument() {
    skip_spaces();
    if (i_ >= s_.size())
      return std::nullopt;
    if (s_[i_] == '{') {
      ++i_;
      return sequence('}');
    }
    if (is_digit(s_[i_]) || is_letter(s_[i_]))
      return std::string(1, s_[i_++]);
    if (s_[i_] == '\\')
      return atom();
    return std::nullopt;
  }

  // A function's argument: a bracketed group, or the next operand ("\sin b").
  std::optional<std::string> function_argument() {
    skip_spaces();
    if (i_ < s_.size() && s_[i_] == '(') {
      ++i_;
      return sequence(')');
    }
    if (i_ < s_.size() && s_[i_] == '{') {
      ++i_;
      return sequence('}');
    }
    return atom();
  }

  std::optional<std::string> atom() {
    skip_spaces();
    if (i_ >= s_.size())
      return std::nullopt;
    char c = s_[i_];
    if (is_digit(c) || c == '.') {
      size_t start = i_;
      bool point = false;
      while (i_ < s_.size() && (is_digit(s_[i_]) || (s_[i_] == '.' && !point))) {
        point = point || s_[i_] == '.';
        ++i_;
      }
      auto number = std::string{s_.substr(start, i_ - start)};
      if (number == "." || number.size() > max_digits)
        return std::nullopt;
      return number.front() == '.' ? "0" + number : number;
    }
    if (is_letter(c)) {
      // Function names written without a backslash; otherwise one letter is one symbol.
      for (auto name : {"sin", "cos", "tan", "log", "ln", "exp", "sqrt"})
        if (s_.substr(i_, std::char_traits<char>::length(name)) == name &&
            (i_ + std::char_traits<char>::length(name) >= s_.size() ||
             !is_letter(s_[i_ + std::char_traits<char>::length(name)]))) {
          i_ += std::char_traits<char>::length(name);
          return function(name);
        }
      ++i_;
      std::string name(1, c);
      if (i_ < s_.size() && s_[i_] == '_') {  // x_1, a_{37}
        ++i_;
        auto sub = group_argument();
        if (!sub)
          return std::nullopt;
        std::string clean;
        for (char d : *sub)
          if (is_letter(d) || is_digit(d))
            clean += d;
        name += "_" + clean;
      }
      // GiNaC's parser reserves these names.
      if (name == "I" || name == "E")
        name = "sym_" + name;
      return name;
    }
    if (c == '(' || c == '[' || c == '{') {
      ++i_;
      return sequence(c == '(' ? ')' : c == '[' ? ']' : '}');
    }
    if (c == '|') {
      ++i_;
      auto inner = sequence('|');
      if (!inner)
        return std::nullopt;
      return "abs(" + *inner + ")";
    }
    if (c == '\\') {
      ++i_;
      auto name = command();
      if (name == "frac") {
        auto a = group_argument();
        auto b = a ? group_argument() : std::nullopt;
        if (!b)
          return std::nullopt;
        return "(" + *a + ")/(" + *b + ")";
      }
      if (name == "sqrt") {
        skip_spaces();
        std::optional<std::string> index;
        if (i_ < s_.size() && s_[i_] == '[') {
          ++i_;
          index = sequence(']');
          if (!index)
            return std::nullopt;
        }
        auto x = group_argument();
        if (!x)
          return std::nullopt;
        return index ? "(" + *x + ")^(1/(" + *index + "))" : "sqrt(" + *x + ")";
      }
      if (name == "pi")
        return std::string{"Pi"};
      if (name == "cdot" || name == "times")
        return std::nullopt;  // handled as operators below
      if (name == "mathrm" || name == "mathit") {
        auto x = group_argument();
        if (!x)
          return std::nullopt;
        return *x == "e" ? "exp(1)" : *x;
      }
      for (auto f : {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
                     "ln", "log", "exp"})
        if (name == f)
          return function(f);
      return std::nullopt;
    }
    return std::nullopt;
  }

  // "\sin^2(x)" -> (sin(x))^(2); sec, csc and cot through cos, sin and tan.
  std::optional<std::string> function(const std::string& name) {
    skip_spaces();
    std::optional<std::string> power;
    if (i_ < s_.size() && s_[i_] == '^') {
      ++i_;
      power = power_operand();
      if (!power)
        return std::nullopt;
    }
    auto x = function_argument();
    if (!x)
      return std::nullopt;
    std::string call;
    if (name == "sec")
      call = "1/cos(" + *x + ")";
    else if (name == "csc")
      call = "1/sin(" + *x + ")";
    else if (name == "cot")
      call = "1/tan(" + *x + ")";
    else if (name == "arcsin" || name == "arccos" || name == "arctan")
      call = "a" + name.substr(3) + "(" + *x + ")";
    else if (name == "ln" || name == "log")
      call = "log(" + *x + ")";
    else
      call = name + "(" + *x + ")";
    return power ? "(" + call + ")^(" + *power + ")" : call;
  }
};

std::set<std::string> symbols_of(const GiNaC::ex& e) {
  std::set<std::string> out;
  for (auto it = e.preorder_begin(); it != e.preorder_end(); ++it)
    if (GiNaC::is_a<GiNaC::symbol>(*it))
      out.insert(GiNaC::ex_to<GiNaC::symbol>(*it).get_name());
  return out;
}

std::optional<GiNaC::numeric> value_at(const GiNaC::ex& e, const GiNaC::exmap& point) {
  auto v = e.subs(point).evalf();
  if (!GiNaC::is_a<GiNaC::numeric>(v))
    return std::nullopt;
  return GiNaC::ex_to<GiNaC::numeric>(v);
}

// A term of `e` (a sum, or one term) with an exact rational coefficient 0 < |c| < 1e-9.
bool has_negligible_term(const GiNaC::ex& e) {
  auto tiny = [](const GiNaC::ex& c) {
    if (!GiNaC::is_a<GiNaC::numeric>(c) || !c.info(GiNaC::info_flags::rational) || c.is_zero())
      return false;
    return GiNaC::abs(GiNaC::ex_to<GiNaC::numeric>(c)) < GiNaC::numeric(1, 1000000000);
  };
  auto term_is_tiny = [&](const GiNaC::ex& t) {
    if (tiny(t))
      return true;
    if (GiNaC::is_a<GiNaC::mul>(t))
      for (size_t i = 0; i < t.nops(); ++i)
        if (tiny(t.op(i)))
          return true;
    return false;
  };
  if (!GiNaC::is_a<GiNaC::add>(e))
    return term_is_tiny(e);
  for (size_t i = 0; i < e.nops(); ++i)
    if (term_is_tiny(e.op(i)))
      return true;
  return false;
}

// Exact sides whose difference is a nonzero exact number ("2^{100}+1" against "2^{100}") differ;
// so do sides apart by a term too small for the samples to see ("\sqrt{6}+10^{-100}\sqrt{2}").
bool differs_exactly(const GiNaC::ex& difference) {
  return (GiNaC::is_a<GiNaC::numeric>(difference) && !difference.is_zero()) || has_negligible_term(difference);
}

// `r` as a fraction with a denominator up to 1000, when it is one (to 1e-9).
std::optional<GiNaC::numeric> small_fraction(double r) {
  for (long den = 1; den <= 1000; ++den) {
    double num = std::round(r * static_cast<double>(den));
    if (std::fabs(num) < 1e15 && std::fabs(num / static_cast<double>(den) - r) <= 1e-9 * std::max(1.0, std::fabs(r)))
      return GiNaC::numeric(static_cast<long>(num), den);
  }
  return std::nullopt;
}

// Both sides read by one parser (so a name is one symbol on both), and three
// sample points: distinct irrational-looking values per free symbol. nullopt:
// the sides have different free symbols.
struct sampled_pair {
  GiNaC::ex x, y;
  std::vector<GiNaC::exmap> points;
};

std::optional<sampled_pair> read_pair(const std::string& a, const std::string& b) {
  GiNaC::parser parse;
  sampled_pair p{parse(a), parse(b), {}};
  auto symbols = symbols_of(p.x);
  if (symbols != symbols_of(p.y))
    return std::nullopt;
  auto table = parse.get_syms();
  for (double base : {0.5772156649015329, 1.3247179572447460, 2.2360679774997897}) {
    GiNaC::exmap point;
    double offset = 0;
    for (auto& name : symbols) {
      point[table.at(name)] = GiNaC::numeric(base + offset);
      offset += 0.1370274;
    }
    p.points.push_back(point);
  }
  return p;
}

}  // namespace

std::optional<std::string> ginac_syntax(std::string_view latex) {
  if (latex.empty() || latex.size() > max_chars)
    return std::nullopt;
  // Explicit products and quotients first: "\cdot", "\times", "\div".
  std::string s{latex};
  for (auto [from, to] : {std::pair{"\\cdot", "*"}, std::pair{"\\times", "*"}, std::pair{"\\div", "/"}})
    for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos))
      s.replace(pos, std::char_traits<char>::length(from), to);
  return reader{s}.run();
}

namespace {

std::optional<bool> equal_here(const std::string& a, const std::string& b, double relative_tolerance) {
  try {
    auto pair = read_pair(a, b);
    if (!pair)
      return false;
    if (relative_tolerance <= 0) {
      auto difference = pair->x - pair->y;
      if (difference.is_zero())
        return true;
      if (differs_exactly(difference))
        return false;
    }
    double limit = relative_tolerance > 0 ? relative_tolerance : 1e-12;
    int compared = 0;
    for (auto& point : pair->points) {
      try {
        auto vx = value_at(pair->x, point);
        auto vy = value_at(pair->y, point);
        if (!vx || !vy)
          return std::nullopt;
        double scale = std::max({1.0, GiNaC::abs(*vx).to_double(), GiNaC::abs(*vy).to_double()});
        if (!(GiNaC::abs(*vx - *vy).to_double() <= limit * scale))
          return false;
        ++compared;
      } catch (const std::exception&) {
        continue;  // e.g. a pole at this point: try the next
      }
    }
    return compared > 0 ? std::optional<bool>{true} : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<double> ratio_here(const std::string& a, const std::string& b) {
  try {
    auto pair = read_pair(a, b);
    if (!pair)
      return std::nullopt;
    std::optional<double> ratio;
    for (auto& point : pair->points) {
      auto vx = value_at(pair->x, point);
      auto vy = value_at(pair->y, point);
      if (!vx || !vy || !vx->is_real() || !vy->is_real() || vy->is_zero())
        return std::nullopt;
      double r = (*vx / *vy).to_double();
      if (!std::isfinite(r) || r == 0 || (ratio && std::fabs(r - *ratio) > 1e-9 * std::max(1.0, std::fabs(r))))
        return std::nullopt;
      ratio = r;
    }
    // A rational ratio is checked exactly: "x^2+y^2 = 2^{100}+1" is not "x^2+y^2 = 2^{100}" scaled.
    if (auto q = small_fraction(*ratio)) {
      if (differs_exactly(pair->x - *q * pair->y))
        return std::nullopt;
    }
    return ratio;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// One comparison, as the algebra process runs it.
cas_answer compare_here(cas_op op, const std::string& a, const std::string& b, double tolerance) {
  if (op == cas_op::equal) {
    auto equal = equal_here(a, b, tolerance);
    return {equal.has_value(), equal && *equal ? 1.0 : 0.0};
  }
  auto ratio = ratio_here(a, b);
  return {ratio.has_value(), ratio.value_or(0.0)};
}

// Every comparison ends within this, in the thread's algebra process (see cas_process.hpp).
constexpr std::chrono::milliseconds comparison_limit{2000};

// Here when no other thread is using GiNaC (one thread pays no hand-over), else in this
// thread's algebra process, so that threads never wait for each other.
std::optional<cas_answer> compare(cas_op op, const std::string& a, const std::string& b, double tolerance) {
  {
    std::unique_lock<std::mutex> here{in_process_cas_mutex(), std::try_to_lock};
    if (here.owns_lock())
      return compare_here(op, a, b, tolerance);
  }
  auto result = run_in_cas_process(builtin_comparison, op, a, b, tolerance, comparison_limit);
  if (result.outcome == cas_result::status::answered)
    return result.answer;
  if (result.outcome == cas_result::status::failed)
    return std::nullopt;
  std::lock_guard<std::mutex> lock{in_process_cas_mutex()};  // no algebra process: here, one at a time
  return compare_here(op, a, b, tolerance);
}

}  // namespace

cas_answer builtin_comparison(cas_op op, const std::string& a, const std::string& b, double tolerance) {
  return compare_here(op, a, b, tolerance);
}

std::optional<bool> expressions_equal(const std::string& a, const std::string& b, double relative_tolerance) {
  auto answer = compare(cas_op::equal, a, b, relative_tolerance);
  if (!answer || !answer->known)
    return std::nullopt;
  return answer->value != 0;
}

std::optional<double> constant_ratio(const std::string& a, const std::string& b) {
  auto answer = compare(cas_op::ratio, a, b, 0);
  if (!answer || !answer->known)
    return std::nullopt;
  return answer->value;
}

}  // namespace areal::reward::math
