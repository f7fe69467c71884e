// Math answers as expressions (internal): LaTeX read into GiNaC expressions
// and compared symbolically and numerically, every step bounded in size.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace areal::reward::math {

/// The GiNaC reading of a cleaned LaTeX scalar ("3\sqrt{13}", "\frac{x+2}{7}",
/// "\tan^2(y)+1"), as GiNaC's parser syntax ("3*sqrt(13)"), or nullopt when it
/// is not an expression this reader knows or is past the bounds (400
/// characters, 40 digits per number, exponents that are not plain numbers up
/// to 1000, no power towers): such answers are compared as text, never
/// evaluated.
std::optional<std::string> ginac_syntax(std::string_view latex);

/// Whether two expressions in GiNaC syntax are equal: exactly (their
/// difference simplifies to zero) or, with the same free symbols, at three
/// sample points to 12 significant digits. `relative_tolerance` > 0 (a
/// decimal reference) compares numeric values within it instead. nullopt:
/// either side could not be read, or the comparison crashed GiNaC or ran past
/// 2 s. Each runs in the calling thread's algebra process (cas_process.hpp):
/// GiNaC is not thread-safe.
std::optional<bool> expressions_equal(const std::string& a, const std::string& b, double relative_tolerance);

}  // namespace areal::reward::math

namespace areal::reward::math {

/// The constant c with a = c * b at every sample point (both in GiNaC
/// syntax, the same free symbols), or nullopt when there is none or either
/// side could not be read: equations and inequalities written with their
/// sides moved or scaled (2x+4y-3 = 0 against y = -x/2 + 3/4).
std::optional<double> constant_ratio(const std::string& a, const std::string& b);

}  // namespace areal::reward::math
