// tokenizer.json, then a text to encode after a NUL. A tokenizer that loads
// encodes any text (or says it cannot) and decodes its own ids back.
#include <cstdint>
#include <stdexcept>

#include "areal/kernels/model_config.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto input = areal::fuzz::parts(data, size, 2, 2);
  std::optional<areal::kernels::tokenizer> tok;
  try {
    tok.emplace(areal::kernels::tokenizer::from_json(input[0], "tokenizer.json"));
  } catch (const areal::kernels::format_error&) {
    return 0;
  }
  try {
    auto ids = tok->encode(input[1]);
    for (auto id : ids)
      if (id < 0 || id >= tok->vocab_size())
        __builtin_trap();
    (void)tok->decode(ids);
    (void)tok->decode(ids, true);
  } catch (const std::invalid_argument&) {  // not encodable without an unk_token
  }
  // Loading what it writes gives the same tokenizer.
  auto again = areal::kernels::tokenizer::from_json(tok->to_json(), "again");
  if (again.vocab_size() != tok->vocab_size())
    __builtin_trap();
  return 0;
}
