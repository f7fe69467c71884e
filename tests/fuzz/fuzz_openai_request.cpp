// The endpoint's request handling: a body for /v1/chat/completions (first
// byte even) or /v1/completions (odd). A body is read or refused with an
// api_error naming what is wrong; a chat that is read renders as a prompt, and
// a reply to it (the next NUL-separated part) parses into content and tool calls.
#include <cstdint>

#include "endpoint_openai.hpp"
#include "fuzz_input.hpp"

namespace {

const areal::kernels::tokenizer& ascii_tokenizer() {
  static const auto tok = [] {
    std::string ascii;
    for (char c = 32; c < 127; ++c)
      ascii += c;
    ascii += "\n\t";
    return areal::kernels::tokenizer::character_level(ascii,
                                                      {"<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  }();
  return tok;
}

void check_error(const areal::openai::api_error& e) {
  if (e.status < 400 || e.status > 599 || e.message.empty())
    __builtin_trap();
  (void)e.body().dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  auto input = areal::fuzz::parts(data + 1, size - 1, 2, 2);
  if (data[0] % 2 == 1) {
    try {
      auto request = areal::openai::parse_completion(input[0]);
      if (request.prompt_text.empty() == request.prompt_ids.empty() && !request.prompt_text.empty())
        __builtin_trap();  // text or ids, not both
    } catch (const areal::openai::api_error& e) {
      check_error(e);
    }
    return 0;
  }
  areal::openai::chat_request request;
  try {
    request = areal::openai::parse_chat(input[0]);
  } catch (const areal::openai::api_error& e) {
    check_error(e);
    return 0;
  }
  static const auto chat = areal::kernels::chat_template::chatml(ascii_tokenizer());
  try {
    auto prompt = chat.render(request.messages, request.tools, true);
    if (prompt.empty())
      __builtin_trap();
  } catch (const areal::kernels::template_error&) {  // a conversation the template cannot render
  }
  auto reply = areal::kernels::chat_template::parse_reply(input[1]);
  (void)areal::openai::tool_calls_json(reply.tool_calls).dump();
  return 0;
}
