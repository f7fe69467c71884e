// Math and countdown verifiers, table-driven: each row is a response, the
// references (or numbers and target) and the verdict it must get.
#include <doctest/doctest.h>

#include "areal/reward/verifiers.hpp"

using namespace areal;
using namespace areal::reward;

namespace {

struct math_row {
  const char* response;
  std::vector<std::string> references;
  verdict expected;
};

}  // namespace

TEST_CASE("math answers: extraction and normalization and comparison") {
  const std::vector<math_row> rows = {
      // extraction
      {"so we get \\boxed{42}.", {"42"}, verdict::correct},
      {"first \\boxed{1} then \\boxed{2}", {"2"}, verdict::correct},
      {"\\boxed{\\frac{\\sqrt{3}}{2}}", {"\\frac{\\sqrt{3}}{2}"}, verdict::correct},
      {"\\boxed{{7}}", {"7"}, verdict::correct},
      {"The answer is 17.", {"17"}, verdict::correct},
      {"Therefore, the answer is: 8. Done", {"8"}, verdict::correct},
      {"After 3 steps we have 12 apples, then 15", {"15"}, verdict::correct},
      {"no digits here at all", {"3"}, verdict::no_answer},
      {"", {"3"}, verdict::no_answer},
      {"\\boxed 5", {"5"}, verdict::correct},
      // whitespace and wrappers
      {"\\boxed{ 12 }", {"12"}, verdict::correct},
      {"\\boxed{\\text{12}}", {"12"}, verdict::correct},
      {"\\boxed{\\mathrm{yes}}", {"Yes"}, verdict::correct},
      {"\\boxed{\\left( 1, 2 \\right)}", {"(1,2)"}, verdict::correct},
      {"$\\boxed{-3}$", {"-3"}, verdict::correct},
      {"\\boxed{\xe2\x88\x92"
       "3}",
       {"-3"},
       verdict::correct},  // Unicode minus
      // thousands separators
      {"\\boxed{1,000,000}", {"1000000"}, verdict::correct},
      {"\\boxed{1{,}234}", {"1234"}, verdict::correct},
      {"The answer is 12,345,678.", {"12345678"}, verdict::correct},
      {"\\boxed{1,2}", {"12"}, verdict::wrong},  // not a thousands separator
      // fractions
      {"\\boxed{\\frac{1}{2}}", {"1/2"}, verdict::correct},
      {"\\boxed{\\dfrac{3}{4}}", {"0.75"}, verdict::correct},
      {"\\boxed{\\frac12}", {"\\frac{1}{2}"}, verdict::correct},
      {"\\boxed{2/4}", {"1/2"}, verdict::correct},
      {"\\boxed{-\\frac{6}{8}}", {"-3/4"}, verdict::correct},
      {"\\boxed{\\frac{1}{3}}", {"1/2"}, verdict::wrong},
      // decimals and tolerance
      {"\\boxed{0.5}", {"1/2"}, verdict::correct},
      {"\\boxed{3.14159}", {"3.1416"}, verdict::correct},
      {"\\boxed{3.2}", {"3.1416"}, verdict::wrong},
      {"\\boxed{0.33333}", {"\\frac{1}{3}"}, verdict::correct},
      {"\\boxed{0.33}", {"\\frac{1}{3}"}, verdict::wrong},
      {"\\boxed{2.50}", {"2.5"}, verdict::correct},
      {"\\boxed{1e3}", {"1000"}, verdict::correct},
      // percent, degrees, units, trailing periods, assignments
      {"\\boxed{50\\%}", {"50"}, verdict::correct},
      {"The answer is 25%.", {"25"}, verdict::correct},
      {"\\boxed{90^\\circ}", {"90"}, verdict::correct},
      {"\\boxed{90^{\\circ}}", {"90"}, verdict::correct},
      {"\\boxed{12 \\text{ cm}}", {"12"}, verdict::correct},
      {"The answer is 7 apples.", {"7"}, verdict::correct},
      {"\\boxed{18.}", {"18"}, verdict::correct},
      {"\\boxed{x = 5}", {"5"}, verdict::correct},
      {"\\boxed{\\$30}", {"30"}, verdict::correct},
      // multiple references
      {"\\boxed{0.25}", {"1/3", "1/4"}, verdict::correct},
      {"\\boxed{\\frac{1}{5}}", {"1/3", "1/4"}, verdict::wrong},
      // plain wrong answers and symbolic ones
      {"\\boxed{41}", {"42"}, verdict::wrong},
      {"\\boxed{x+1}", {"x + 1"}, verdict::correct},
      {"\\boxed{x+2}", {"x+1"}, verdict::wrong},
      // overflowing numbers compare approximately instead of crashing
      {"\\boxed{123456789012345678901234567890123456789012345}", {"1"}, verdict::wrong},
  };
  for (auto& row : rows) {
    auto v = verify_math(row.response, row.references);
    INFO("response: " << std::string{row.response} << " | detail: " << v.detail);
    CHECK(v.judged == row.expected);
    CHECK(v.reward == (row.expected == verdict::correct ? 1.0f : 0.0f));
  }
  CHECK(rows.size() >= 40);
}

TEST_CASE("math answers inside long responses are found at the end") {
  std::string response(200000, 'a');
  response += " so the answer is \\boxed{9}";
  CHECK(verify_math(response, {"9"}).judged == verdict::correct);
}

namespace {

struct countdown_row {
  const char* response;
  std::vector<long long> numbers;
  long long target;
  verdict expected;
  const char* detail_part;
};

}  // namespace

TEST_CASE("countdown answers: numbers used and exact value") {
  const std::vector<countdown_row> rows = {
      {"<answer>(25 - 5) * 4</answer>", {25, 5, 4, 3}, 80, verdict::correct, "= 80"},
      {"<answer>25 * 4 - 20</answer>", {25, 4, 20}, 80, verdict::correct, ""},
      {"<answer> 100 / 4 + 5 </answer>", {100, 4, 5}, 30, verdict::correct, ""},
      {"<answer>(3 + 3) * 2</answer>", {3, 3, 2}, 12, verdict::correct, ""},  // a number given twice, used twice
      {"<answer>(3 + 3) * 2</answer>", {3, 2, 7}, 12, verdict::wrong, "uses 3 more often than given"},
      {"<answer>7 * 7</answer>", {7, 1}, 49, verdict::wrong, "more often"},
      {"<answer>8 / (3 - 3)</answer>", {8, 3, 3}, 1, verdict::wrong, "division by zero"},
      {"<answer>6 / 4 * 2</answer>", {6, 4, 2}, 3, verdict::correct, ""},  // exact 3/2 * 2
      {"<answer>7 / 2</answer>", {7, 2}, 3, verdict::wrong, "= 7/2"},
      {"<answer>25 + 4 = 29</answer>", {25, 4}, 29, verdict::correct, ""},
      {"Let me think.\n(10 - 2) * 3", {10, 2, 3}, 24, verdict::correct, ""},
      {"the answer is 6 \\times 4.", {6, 4}, 24, verdict::correct, ""},
      {"\\boxed{(2 + 4) \\div 3}", {2, 4, 3}, 2, verdict::correct, ""},
      {"<answer>6 \xc3\x97 4</answer>", {6, 4}, 24, verdict::correct, ""},  // ×
      {"<answer>-5 + 10</answer>", {5, 10}, 5, verdict::wrong, "unexpected '-'"},
      {"<answer>5 +* 10</answer>", {5, 10}, 15, verdict::wrong, "unexpected '*'"},
      {"<answer>((5 + 10)</answer>", {5, 10}, 15, verdict::wrong, "missing ')'"},
      {"<answer>import os</answer>", {5}, 5, verdict::wrong, "unexpected 'i'"},
      {"<answer>99999999999999999999 + 1</answer>", {1}, 2, verdict::wrong, "number too large"},
      {"<answer></answer>", {1, 2}, 3, verdict::no_answer, ""},
      {"   \n  ", {1, 2}, 3, verdict::no_answer, ""},
      {"<answer>1 + 2</answer>", {1, 2}, 4, verdict::wrong, "target 4"},
  };
  for (auto& row : rows) {
    auto v = verify_countdown(row.response, row.numbers, row.target);
    INFO("response: " << std::string{row.response} << " | detail: " << v.detail);
    CHECK(v.judged == row.expected);
    CHECK(v.detail.find(row.detail_part) != std::string::npos);
  }
  CHECK(rows.size() >= 20);
}

TEST_CASE("countdown bounds: length and depth and all-numbers rule") {
  std::string deep(40, '(');
  deep += "1";
  deep += std::string(40, ')');
  auto v = verify_countdown("<answer>" + deep + "</answer>", {1}, 1);
  CHECK(v.judged == verdict::wrong);
  CHECK(v.detail.find("nested deeper than 32") != std::string::npos);
  std::string longest = "1";
  for (int i = 0; i < 200; ++i)
    longest += " + 1";
  CHECK(verify_countdown("<answer>" + longest + "</answer>", {1}, 201).detail.find("longer than 256") !=
        std::string::npos);
  countdown_options all;
  all.use_all_numbers = true;
  CHECK(verify_countdown("<answer>2 * 3</answer>", {2, 3, 4}, 6, all).judged == verdict::wrong);
  CHECK(verify_countdown("<answer>2 * 3 * 4 / 4</answer>", {2, 3, 4, 4}, 6, all).judged == verdict::correct);
}

TEST_CASE("rational arithmetic is exact and refuses overflow") {
  auto third = *parse_rational("1/3");
  auto sum = *third.add(third)->add(third);
  CHECK(sum == rational::integer(1));
  CHECK(parse_rational("0.125")->to_string() == "1/8");
  CHECK(parse_rational("-2.5e1")->to_string() == "-25");
  CHECK_FALSE(parse_rational("1/0"));
  CHECK_FALSE(parse_rational("abc"));
  CHECK_FALSE(parse_rational("1.2.3"));
  auto big = *parse_rational("100000000000000000000000000000000000");  // 1e35
  CHECK_FALSE(big.multiply(big));
}
