// The math verifier: a response, then references separated by NULs; the
// first byte picks the options. Any text gets a verdict with a reward in [0, 1].
#include <cstdint>

#include "areal/reward/verifiers.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  areal::reward::math_options options;
  options.unmarked_fallback = data[0] & 1;
  options.last_number_is_answer = data[0] & 2;
  options.chain_answers_interval = data[0] & 4;
  auto input = areal::fuzz::parts(data + 1, size - 1, 2, 5);
  std::vector<std::string> references(input.begin() + 1, input.end());
  (void)areal::reward::extract_math_answers(input[0], options.unmarked_fallback, options.last_number_is_answer);
  (void)areal::reward::normalize_math_answer(input[0]);
  auto v = areal::reward::verify_math(input[0], references, options);
  if (!(v.reward >= 0.0f && v.reward <= 1.0f))
    __builtin_trap();
  return 0;
}

// libcln allocates a block at start-up that it never frees, and GiNaC leaks a
// few bytes when an expression throws (a division by zero): not ours to fix.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libcln.so\nleak:libginac.so\n";
}
