// Exact rational numbers for answer checking: 128-bit numerator and denominator,
// always reduced, with every operation checked for overflow (an answer too big
// for 128 bits is compared approximately instead, never wrongly).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace areal::reward {

// GCC/Clang 128-bit integers (__extension__ keeps -Wpedantic quiet about them).
__extension__ typedef __int128 wide_int;
__extension__ typedef unsigned __int128 wide_uint;

class rational {
 public:
  rational() = default;
  static std::optional<rational> make(wide_int numerator, wide_int denominator);  // nullopt: zero denominator
  static rational integer(long long x) { return *make(x, 1); }

  wide_int numerator() const { return num_; }
  wide_int denominator() const { return den_; }
  long double approx() const { return static_cast<long double>(num_) / static_cast<long double>(den_); }
  bool is_zero() const { return num_ == 0; }

  // nullopt on overflow (or division by zero for divide).
  std::optional<rational> add(const rational& o) const;
  std::optional<rational> subtract(const rational& o) const;
  std::optional<rational> multiply(const rational& o) const;
  std::optional<rational> divide(const rational& o) const;
  std::optional<rational> negate() const;

  bool operator==(const rational& o) const { return num_ == o.num_ && den_ == o.den_; }
  std::string to_string() const;

 private:
  wide_int num_ = 0;
  wide_int den_ = 1;
};

/// Parses "-12", "3/4", "-0.125", "1e3" (exact where the text is), or nullopt.
/// `is_decimal` tells whether the text had a decimal point or exponent.
std::optional<rational> parse_rational(std::string_view text, bool* is_decimal = nullptr);

}  // namespace areal::reward
