// Exact rational numbers for the math verifier: parsing and comparison (see rational.hpp).
#include "areal/reward/rational.hpp"

#include <algorithm>
#include <cctype>

namespace areal::reward {

namespace {

wide_int gcd(wide_int a, wide_int b) {
  if (a < 0)
    a = -a;
  if (b < 0)
    b = -b;
  while (b != 0) {
    auto t = a % b;
    a = b;
    b = t;
  }
  return a;
}

constexpr wide_int int128_max = static_cast<wide_int>((~static_cast<wide_uint>(0)) >> 1);

bool mul_overflows(wide_int a, wide_int b, wide_int* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::optional<rational> rational::make(wide_int n, wide_int d) {
  if (d == 0)
    return std::nullopt;
  if (n == -int128_max - 1 || d == -int128_max - 1)
    return std::nullopt;  // cannot be negated
  if (d < 0) {
    n = -n;
    d = -d;
  }
  auto g = gcd(n, d);
  rational r;
  r.num_ = g == 0 ? 0 : n / g;
  r.den_ = g == 0 ? 1 : d / g;
  return r;
}

std::optional<rational> rational::add(const rational& o) const {
  wide_int a, b, d, n;
  if (mul_overflows(num_, o.den_, &a) || mul_overflows(o.num_, den_, &b) || mul_overflows(den_, o.den_, &d) ||
      __builtin_add_overflow(a, b, &n))
    return std::nullopt;
  return make(n, d);
}

std::optional<rational> rational::negate() const {
  return make(-num_, den_);
}

std::optional<rational> rational::subtract(const rational& o) const {
  auto neg = o.negate();
  if (!neg)
    return std::nullopt;
  return add(*neg);
}

std::optional<rational> rational::multiply(const rational& o) const {
  // Cross-reduce first to keep intermediate values small.
  auto g1 = gcd(num_, o.den_);
  auto g2 = gcd(o.num_, den_);
  g1 = g1 == 0 ? 1 : g1;
  g2 = g2 == 0 ? 1 : g2;
  wide_int n, d;
  if (mul_overflows(num_ / g1, o.num_ / g2, &n) || mul_overflows(den_ / g2, o.den_ / g1, &d))
    return std::nullopt;
  return make(n, d);
}

std::optional<rational> rational::divide(const rational& o) const {
  if (o.num_ == 0)
    return std::nullopt;
  auto inverse = make(o.den_, o.num_);
  if (!inverse)
    return std::nullopt;
  return multiply(*inverse);
}

namespace {
std::string int128_to_string(wide_int x) {
  if (x == 0)
    return "0";
  bool negative = x < 0;
  wide_uint u = negative ? static_cast<wide_uint>(-(x + 1)) + 1 : static_cast<wide_uint>(x);
  std::string out;
  while (u > 0) {
    out += static_cast<char>('0' + static_cast<int>(u % 10));
    u /= 10;
  }
  if (negative)
    out += '-';
  std::reverse(out.begin(), out.end());
  return out;
}
}  // namespace

std::string rational::to_string() const {
  return den_ == 1 ? int128_to_string(num_) : int128_to_string(num_) + "/" + int128_to_string(den_);
}

std::optional<rational> parse_rational(std::string_view s, bool* is_decimal) {
  if (is_decimal)
    *is_decimal = false;
  if (s.empty() || s.size() > 80)
    return std::nullopt;
  if (auto slash = s.find('/'); slash != std::string_view::npos) {
    bool d1 = false, d2 = false;
    auto a = parse_rational(s.substr(0, slash), &d1);
    auto b = parse_rational(s.substr(slash + 1), &d2);
    if (!a || !b)
      return std::nullopt;
    if (is_decimal)
      *is_decimal = d1 || d2;
    return a->divide(*b);
  }
  size_t i = 0;
  bool negative = false;
  if (s[i] == '-' || s[i] == '+') {
    negative = s[i] == '-';
    ++i;
  }
  wide_int mantissa = 0;
  int scale = 0;  // digits after the point
  bool digits = false, point = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
      if (__builtin_mul_overflow(mantissa, static_cast<wide_int>(10), &mantissa) ||
          __builtin_add_overflow(mantissa, static_cast<wide_int>(c - '0'), &mantissa))
        return std::nullopt;
      if (point)
        ++scale;
    } else if (c == '.' && !point) {
      point = true;
    } else {
      break;
    }
  }
  if (!digits)
    return std::nullopt;
  long exponent = 0;
  bool has_exponent = false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+'))
      exp_negative = s[i++] == '-';
    bool exp_digits = false;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
      exponent = exponent * 10 + (s[i] - '0');
      exp_digits = true;
      if (exponent > 60)
        return std::nullopt;
    }
    if (!exp_digits)
      return std::nullopt;
    if (exp_negative)
      exponent = -exponent;
    has_exponent = true;
  }
  if (i != s.size())
    return std::nullopt;
  if (is_decimal)
    *is_decimal = point || has_exponent;
  long power = exponent - scale;
  wide_int num = negative ? -mantissa : mantissa;
  wide_int den = 1;
  for (long k = 0; k < (power > 0 ? power : -power); ++k) {
    auto& target = power > 0 ? num : den;
    if (__builtin_mul_overflow(target, static_cast<wide_int>(10), &target))
      return std::nullopt;
  }
  return rational::make(num, den);
}

}  // namespace areal::reward
