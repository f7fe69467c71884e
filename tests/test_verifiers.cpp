// Math and countdown verifiers, table-driven: each row is a response, the
// references (or numbers and target) and the verdict it must get.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "areal/reward/verifiers.hpp"
#include "cas_process.hpp"
#include "child_processes.hpp"

using namespace areal;
using namespace areal::reward;

namespace {

struct math_row {
  const char* response;
  std::vector<std::string> references;
  verdict expected;
};

// Each row's verdict (and reward: 1 for correct, else 0).
void check_rows(const std::vector<math_row>& rows) {
  for (auto& row : rows) {
    auto v = verify_math(row.response, row.references);
    INFO("response: " << std::string{row.response} << " | detail: " << v.detail);
    CHECK(v.judged == row.expected);
    CHECK(v.reward == (row.expected == verdict::correct ? 1.0f : 0.0f));
  }
}

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
      {"After 3 steps we have 12 apples, then 15", {"15"}, verdict::no_answer},  // unmarked: see the fallback case
      {"$\\frac13$", {"1/3"}, verdict::correct},                                 // nothing but one answer
      {"x = 5", {"5"}, verdict::correct},
      {"Answer $ 9 $", {"9"}, verdict::correct},
      {"The final answer is $(0, 1)$. I hope it is correct.", {"(0,1)"}, verdict::correct},
      {"no digits here at all", {"3"}, verdict::no_answer},
      {"", {"3"}, verdict::no_answer},
      {"\\boxed 5", {"5"}, verdict::correct},
      // "Final Answer: The final answer is $X$" after the boxes is the last word; other words after them are not
      {"first \\boxed{200}, then \\boxed{255}. Final Answer: The final answer is $10,455$. I hope it is correct.",
       {"10455"},
       verdict::correct},
      {"so \\boxed{7}. Final Answer: The final answer is \"seven\".", {"7"}, verdict::correct},
      {"$\\boxed{20}$ percent", {"20\\%"}, verdict::correct},  // the word after the box: a percentage
      {"$\\boxed{20}$ percent", {"20"}, verdict::wrong},
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
      {"\\boxed{14 {, }916}", {"14916"}, verdict::correct},
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
      {"\\boxed{0.33333}", {"\\frac{1}{3}"}, verdict::wrong},  // a fraction is compared exactly
      {"\\boxed{0.33}", {"\\frac{1}{3}"}, verdict::wrong},
      {"\\boxed{2.50}", {"2.5"}, verdict::correct},
      {"\\boxed{1e3}", {"1000"}, verdict::correct},
      // percent, degrees, units, trailing periods, assignments
      {"\\boxed{50\\%}", {"50\\%"}, verdict::correct},
      {"\\boxed{50}", {"50\\%"}, verdict::correct},
      {"The answer is 25 percent.", {"25\\%"}, verdict::correct},
      {"\\boxed{50\\%}", {"0.5"}, verdict::correct},  // percent is /100 where the reference is no percent
      {"\\boxed{5\\%}", {"5"}, verdict::wrong},
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
  check_rows(rows);
  CHECK(rows.size() >= 40);
}

TEST_CASE("math answers: the wrong answers the old verifier accepted are refused") {
  const std::vector<math_row> rows = {
      {"$\\frac{1+\\sqrt{5}}{2}$", {"2"}, verdict::wrong},  // not its denominator
      {"\\boxed{32, 349}", {"32349"}, verdict::wrong},      // a list, not thousands
      {"\\boxed{1, 234}", {"1234"}, verdict::wrong},
      {"\\boxed{32,\\! 349}", {"32349"}, verdict::correct},  // thousands, marked as such
      {"\\boxed{14{,}916}", {"14916"}, verdict::correct},
      {"\\boxed{10456.0}", {"10455"}, verdict::wrong},  // an integer reference is compared exactly
      {"\\boxed{10455.0}", {"10455"}, verdict::correct},
      {"\\boxed{12 \\text{ or more}}", {"12"}, verdict::wrong},
      {"\\boxed{y = 4}", {"x = 4"}, verdict::wrong},
      {"\\boxed{x = 4}", {"x=4"}, verdict::correct},
      {"\\boxed{4}", {"x = 4"}, verdict::correct},
      {"\\boxed{125\\textnormal{ miles}}", {"125"}, verdict::correct},
      {"\\boxed{\\textbf{7}}", {"7"}, verdict::correct},
      {"\\boxed{(1/3)}", {"1/3"}, verdict::correct},
      {"\\boxed{(-1)/2}", {"-1/2"}, verdict::correct},
      {"\\boxed{1000,99}", {"1000.99"}, verdict::correct},  // a decimal comma: no thousands group
      {"\\boxed{0,111}", {"0.111"}, verdict::correct},
      {"\\boxed{1,234}", {"1.234"}, verdict::wrong},  // a thousands group
      // exact expressions apart by a number too small for sampling to see
      {"\\boxed{2^{100}+1}", {"2^{100}"}, verdict::wrong},
      {"\\boxed{x+10^{-15}}", {"x"}, verdict::wrong},
      {"\\boxed{\\sqrt{2}\\sqrt{3}+10^{-100}\\sqrt{5}}", {"\\sqrt{6}"}, verdict::wrong},
      {"\\boxed{\\sqrt{2}\\sqrt{3}}", {"\\sqrt{6}"}, verdict::correct},
      {"\\boxed{x^2+y^2 = 2^{100}+1}", {"x^2+y^2=2^{100}"}, verdict::wrong},
      {"\\boxed{2x^2+2y^2 = 2^{101}}", {"x^2+y^2=2^{100}"}, verdict::correct},
  };
  check_rows(rows);
  // A digit inside a word is no answer, even with the last-number fallback on.
  math_options fallback;
  fallback.unmarked_fallback = true;
  CHECK(verify_math("AZYUK2A", {"2"}, fallback).judged == verdict::wrong);  // a bare answer, and not 2
  CHECK(verify_math("the code we found was AZYUK2A", {"2"}, fallback).judged == verdict::no_answer);
  CHECK(verify_math("After 3 steps we have 12 apples, then 15", {"15"}, fallback).judged == verdict::correct);
  CHECK(verify_math("so the number is 10 which is 1,000.99m", {"1000.99"}, fallback).judged == verdict::correct);
  // The fallback reads whichever comes last: the last math, or a number standing after it.
  auto sequences = "so $d = \\frac{90}{n}$ for each divisor; there are 12 such sequences.";
  CHECK(verify_math(sequences, {"12"}, fallback).judged == verdict::correct);
  CHECK(verify_math("we found 3 cases, so $x = 7$.", {"7"}, fallback).judged == verdict::correct);
  // An unclosed "$" makes no bare answer: the fallback's number, else no answer at all.
  CHECK(verify_math("Soucis : 2,74 $ a..", {"2.74"}, fallback).judged == verdict::correct);
  CHECK(verify_math("Soucis : 2,74 $ a..", {"2.74"}).judged == verdict::no_answer);
}

TEST_CASE("math answers: structures, relations and expressions") {
  const std::vector<math_row> rows = {
      {"\\boxed{[0,1)}", {"[0,1)"}, verdict::correct},
      {"\\boxed{[0,1)}", {"(0,1)"}, verdict::wrong},
      {"\\boxed{\\{3, 1, 2\\}}", {"\\{1,2,3\\}"}, verdict::correct},
      {"\\boxed{(1,2)}", {"(2,1)"}, verdict::wrong},
      {"\\boxed{[-1, -\\tfrac12) \\cup (0, 1)}", {"(0,1) \\cup [-1,-\\frac{1}{2})"}, verdict::correct},
      {"\\boxed{1 \\pm \\sqrt{19}}", {"1+\\sqrt{19}, 1-\\sqrt{19}"}, verdict::correct},
      {"\\boxed{x \\geq 5}", {"5 \\leq x"}, verdict::correct},
      {"\\boxed{x < 5}", {"x > 5"}, verdict::wrong},
      {"\\boxed{-x > -1}", {"x < 1"}, verdict::correct},
      {"\\boxed{x > -1}", {"x < 1"}, verdict::wrong},
      {"\\boxed{y=-\\frac{1}{2}x+\\frac{3}{4}}", {"2x+4y-3=0"}, verdict::correct},
      {"\\boxed{\\frac{x}{7}+\\frac{2}{7}}", {"\\frac{x+2}{7}"}, verdict::correct},
      {"\\boxed{3\\sqrt{13}}", {"\\sqrt{117}"}, verdict::correct},
      {"\\boxed{\\sec^2(y)}", {"\\tan^2(y)+1"}, verdict::correct},
      {"\\boxed{\\frac94\\pi}", {"\\frac{9}{4}\\pi"}, verdict::correct},
      {"\\boxed{2 \\sin b \\cos a}", {"2\\cos(a)\\sin(b)"}, verdict::correct},
      {"\\boxed{2\\pi}", {"6.2832"}, verdict::correct},    // a decimal reference: within its tolerance
      {"\\boxed{1.4142}", {"\\sqrt{2}"}, verdict::wrong},  // an exact reference: exactly
      {"\\boxed{(a+5)(b+2)}", {"ab+2a+5b+10"}, verdict::correct},
      {"\\boxed{f(y)}", {"f(x)"}, verdict::wrong},
      {"\\boxed{\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}}",
       {"\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}"},
       verdict::correct},
      {"\\boxed{\\begin{pmatrix}1 & 2 \\\\ 3 & 5\\end{pmatrix}}",
       {"\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"},
       verdict::wrong},
      {"so \\boxed{1} and \\boxed{2}", {"1, 2"}, verdict::correct},
      {"\\boxed{\\text{(C)}}", {"C"}, verdict::correct},
      {"\\boxed{\\text{E}}", {"d"}, verdict::wrong},
      {"\\boxed{\\begin{pmatrix}1&0\\\\0&1\\\\\\end{pmatrix}}",  // a row break before \end
       {"\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}"},
       verdict::correct},
      // chains of inequalities, in either direction; their intervals; |x| between bounds as a union
      {"\\boxed{f(2) < f(1) < f(4)}", {"f(2) < f(1) < f(4)"}, verdict::correct},
      {"\\boxed{7 > f(1) > 5}", {"5 < f(1) < 7"}, verdict::correct},
      {"\\boxed{1 < x < 2}", {"1 < x \\le 2"}, verdict::wrong},
      {"\\boxed{(1,3]}", {"1 < x \\le 3"}, verdict::correct},
      {"\\boxed{(1,3]}", {"3 \\geq x > 1"}, verdict::correct},
      {"\\boxed{[1,3]}", {"1 < x \\le 3"}, verdict::wrong},
      {"\\boxed{[-3,-1] \\cup [1,3]}", {"1 \\le |z| \\le 3"}, verdict::correct},
      {"\\boxed{[-3,-1) \\cup [1,3]}", {"1 \\le |z| \\le 3"}, verdict::wrong},
      {"\\boxed{[1,3]}", {"1 \\le |z| \\le 3"}, verdict::wrong},
      {"\\boxed{-2 \\le x \\le 7}", {"x \\in [-2,7]"}, verdict::wrong},  // unless chain_answers_interval
      // matrices written as arithmetic of matrices
      {"\\boxed{\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix} + \\begin{pmatrix}5 & 6 \\\\ 7 & 8\\end{pmatrix}}",
       {"\\begin{pmatrix}6 & 8 \\\\ 10 & 12\\end{pmatrix}"},
       verdict::correct},
      {"\\boxed{\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix} \\begin{pmatrix}5 & 6 \\\\ 7 & 8\\end{pmatrix}}",
       {"\\begin{pmatrix}19 & 22 \\\\ 43 & 50\\end{pmatrix}"},
       verdict::correct},
      {"\\boxed{\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix} \\begin{pmatrix}5 & 6 \\\\ 7 & 8\\end{pmatrix}}",
       {"\\begin{pmatrix}19 & 22 \\\\ 43 & 51\\end{pmatrix}"},
       verdict::wrong},
      {"\\boxed{\\begin{pmatrix}1 & 2\\end{pmatrix} - \\begin{pmatrix}1 \\\\ 2\\end{pmatrix}}",
       {"\\begin{pmatrix}0 & 0\\end{pmatrix}"},
       verdict::wrong},  // sizes that do not fit
      // solutions naming their values, against tuples
      {"\\boxed{(5,2),(7,2)}", {"p=5,q=2;p=7,q=2"}, verdict::correct},
      {"\\boxed{(2,5),(7,2)}", {"p=5,q=2;p=7,q=2"}, verdict::wrong},
  };
  check_rows(rows);
  math_options intervals;
  intervals.chain_answers_interval = true;
  CHECK(verify_math("\\boxed{-2 \\le x \\le 7}", {"x \\in [-2,7]"}, intervals).judged == verdict::correct);
  CHECK(verify_math("\\boxed{-2 < x \\le 7}", {"x \\in [-2,7]"}, intervals).judged == verdict::wrong);
}

TEST_CASE("math answers: hostile expressions end in a verdict") {
  CHECK(verify_math("\\boxed{10^{10^{10}}}", {"1"}).judged == verdict::wrong);
  CHECK(verify_math("\\boxed{2^{100000}}", {"1"}).judged == verdict::wrong);
  std::string huge = "\\boxed{" + std::string(1 << 20, '(') + "1" + std::string(1 << 20, ')') + "}";
  CHECK(verify_math(huge, {"1"}).judged != verdict::correct);
  std::string long_sum = "\\boxed{";
  for (int i = 0; i < 10000; ++i)
    long_sum += "x+";
  long_sum += "1}";
  CHECK(verify_math(long_sum, {"1"}).judged == verdict::wrong);
  // Found by fuzzing (tests/fuzz/corpus/math_verifier/regression_empty_sqrt): an empty
  // argument reached GiNaC as "sqrt()", and its parser crashed the scoring process.
  CHECK(verify_math("the roots are \\boxed{3 \\pm 2 \\sqrt{}2}.", {"3 \\pm 2 \\sqrt{2}"}).judged == verdict::wrong);
  CHECK(verify_math("\\boxed{\\sin{} x + \\frac{}{2}}", {"x"}).judged == verdict::wrong);
  CHECK(verify_math("\\boxed{x^{+} + (-)}", {"x"}).judged == verdict::wrong);
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

namespace {

// A Math-Verify gold answer as this verifier's reference: its boxed answers, else the answer it is.
std::string reference_of(const std::string& gold) {
  auto answers = extract_math_answers(gold);
  if (answers.empty())
    return gold;
  std::string joined;
  for (auto& a : answers)
    joined += (joined.empty() ? "" : ", ") + a;
  return joined;
}

}  // namespace

TEST_CASE("Math-Verify's own test cases: agreement, and no wrong answer accepted") {
  // tests/data/math_verify_cases.jsonl: made by tests/data/import_math_verify.py from huggingface/Math-Verify.
  std::ifstream in(std::string{AREAL_SOURCE_DIR} + "/tests/data/math_verify_cases.jsonl");
  REQUIRE(in);
  size_t cases = 0, agree = 0, false_positives = 0;
  std::string line;
  while (std::getline(in, line)) {
    auto c = nlohmann::json::parse(line);
    ++cases;
    math_options options;
    // Math-Verify reads unmarked answers (the last math, the last number): our fallback, off for RL by default.
    options.unmarked_fallback = true;
    options.chain_answers_interval = c.value("allow_set_relation_comp", false);
    auto reference = reference_of(c["gold"].get<std::string>());
    auto v = verify_math(c["prediction"].get<std::string>(), {reference}, options);
    bool accepted = v.judged == verdict::correct, expected = c["expected"].get<bool>();
    if (accepted == expected) {
      ++agree;
      continue;
    }
    false_positives += accepted;
    MESSAGE("disagreement (" << std::string{accepted ? "accepted" : "refused"} << ", Math-Verify "
                             << std::string{expected ? "accepts" : "refuses"} << ") " << c["source"].get<std::string>()
                             << ": gold " << c["gold"].dump().substr(0, 120) << " prediction "
                             << c["prediction"].dump().substr(0, 160) << " | " << v.detail.substr(0, 200));
  }
  MESSAGE("Math-Verify suite: " << agree << "/" << cases << " cases agree ("
                                << (100.0 * static_cast<double>(agree) / static_cast<double>(cases)) << "%), "
                                << false_positives << " false positives");
  CHECK(cases == 268);
  CHECK(agree * 100 >= cases * 95);
  CHECK(false_positives == 0);
}

namespace {

using namespace areal::reward::math;

// The compared texts are commands: the algebra process crashes, hangs, or says where it runs.
cas_answer scripted(cas_op, const std::string& a, const std::string& b, double) {
  if (a == "crash")
    ::kill(::getpid(), SIGKILL);
  if (a == "hang")
    std::this_thread::sleep_for(std::chrono::seconds(30));
  if (a == "pid")
    return {true, static_cast<double>(::getpid())};
  return {true, a == b ? 1.0 : 0.0};
}

}  // namespace

TEST_CASE("an algebra process answers in a process of its own: one that crashes or hangs is ended, not the caller") {
  using status = cas_result::status;
  auto run = [](const std::string& a, const std::string& b, int limit_ms = 2000) {
    return run_in_cas_process(scripted, cas_op::equal, a, b, 0, std::chrono::milliseconds(limit_ms));
  };
  auto same = run("x", "x");
  REQUIRE(same.outcome == status::answered);
  CHECK(same.answer.value == 1.0);
  CHECK(run("x", "y").answer.value == 0.0);
  auto where = run("pid", "");
  REQUIRE(where.outcome == status::answered);
  CHECK(where.answer.value != static_cast<double>(::getpid()));
  CHECK(run("crash", "").outcome == status::failed);
  CHECK(run("x", "x").outcome == status::answered);  // a fresh process
  auto start = std::chrono::steady_clock::now();
  CHECK(run("hang", "", 300).outcome == status::failed);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  auto after = run("pid", "");
  REQUIRE(after.outcome == status::answered);
  CHECK(after.answer.value != where.answer.value);  // the hung one was ended and replaced
}

TEST_CASE("the algebra process is the areal-algebra program, which holds none of the caller's memory") {
  // A fork of this process would keep these pages (and every one rewritten after it) for its whole life.
  auto weights = touched_memory(256);
  std::atomic<bool> asked{false}, done{false};
  cas_result answer;
  std::thread caller{[&] {
    answer = run_in_cas_process(builtin_comparison, cas_op::equal, "(x-1)*(x+1)", "x^2-1", 0,
                                std::chrono::milliseconds(2000));
    asked = true;
    while (!done)  // the thread's algebra process lives as long as the thread
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }};
  while (!asked)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto children = child_processes();
  done = true;
  caller.join();
  REQUIRE(answer.outcome == cas_result::status::answered);
  CHECK(answer.answer.known);
  CHECK(answer.answer.value == 1.0);
  bool found = false;
  for (auto& c : children) {
    CAPTURE(c.program);
    CAPTURE(c.resident_kb);
    if (std::filesystem::path{c.program}.filename() != "areal-algebra")
      continue;
    found = true;
    CHECK(c.resident_kb < 64 * 1024);  // its own libraries only; a fork: the 256 MB above and more
  }
  CHECK_MESSAGE(found, children.size() << " child process(es), none of them areal-algebra");
  CHECK(weights.size() == size_t{256} << 20);
}

TEST_CASE("an areal-algebra of another build, or one that says nothing, is replaced by a fork") {
  auto dir = std::filesystem::temp_directory_path() / ("areal-helpers-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto program = dir / "areal-algebra";
  for (std::string body : {"printf 'XXXX' >&3\nexec sleep 30\n", "exit 0\n"}) {
    CAPTURE(body);
    std::ofstream(program) << "#!/bin/sh\n" << body;
    std::filesystem::permissions(program, std::filesystem::perms::owner_all);
    ::setenv("AREAL_HELPER_DIR", dir.c_str(), 1);
    cas_result answer;
    std::vector<child_process> children;
    std::atomic<bool> asked{false}, done{false};
    std::thread caller{[&] {
      answer = run_in_cas_process(builtin_comparison, cas_op::equal, "(x-1)*(x+1)", "x^2-1", 0,
                                  std::chrono::milliseconds(10000));
      asked = true;
      while (!done)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }};
    while (!asked)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    children = child_processes();
    done = true;
    caller.join();
    ::unsetenv("AREAL_HELPER_DIR");
    REQUIRE(answer.outcome == cas_result::status::answered);
    CHECK(answer.answer.value == 1.0);
    auto self = std::filesystem::read_symlink("/proc/self/exe");
    bool forked = false;
    for (auto& c : children) {
      CHECK(c.program.find("areal-algebra") == std::string::npos);  // the impostor was ended
      forked |= c.program == self.string();
    }
    CHECK(forked);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("expression comparisons from many threads at once get the right verdicts") {
  std::atomic<int> wrong_verdicts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 150; ++i) {
        bool right = (i + t) % 2 == 0;
        auto v =
            verify_math(right ? "\\boxed{\\frac{x}{7}+\\frac{2}{7}+2\\sqrt{3}}" : "\\boxed{\\frac{x}{7}+2\\sqrt{3}}",
                        {"\\frac{x+2}{7} + \\sqrt{12}"});
        wrong_verdicts += (v.judged == verdict::correct) != right;
      }
    });
  for (auto& th : threads)
    th.join();
  CHECK(wrong_verdicts == 0);
}
