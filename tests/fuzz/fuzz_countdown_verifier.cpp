// The countdown verifier: numbers and a target from the first bytes, then the
// response. It judges every response, and a correct one really hits the target.
#include <cstdint>

#include "areal/reward/verifiers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3)
    return 0;
  size_t count = data[0] % 7;  // up to six numbers
  if (size < 3 + count)
    return 0;
  std::vector<long long> numbers;
  for (size_t i = 0; i < count; ++i)
    numbers.push_back(static_cast<long long>(data[3 + i]) - 16);  // a few negatives too
  long long target = static_cast<long long>(data[1]) * 8 + data[2] - 1000;
  areal::reward::countdown_options options;
  options.use_all_numbers = data[0] & 0x80;
  std::string_view response{reinterpret_cast<const char*>(data) + 3 + count, size - 3 - count};
  auto v = areal::reward::verify_countdown(response, numbers, target, options);
  if (!(v.reward >= 0.0f && v.reward <= 1.0f))
    __builtin_trap();
  if (v.judged == areal::verdict::correct) {
    auto expression = areal::reward::extract_countdown_expression(response);
    if (!expression)
      __builtin_trap();
    std::vector<long long> used;
    auto value = areal::reward::evaluate_expression(*expression, &used, options);
    if (!value.value || !(*value.value == areal::reward::rational::integer(target)))
      __builtin_trap();  // judged correct, so it equals the target
  }
  return 0;
}

// libcln allocates a block at start-up that it never frees: not ours to fix.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libcln.so\n";
}
