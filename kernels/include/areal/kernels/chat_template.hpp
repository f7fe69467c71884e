// Chat templates: OpenAI-style messages rendered into the token ids a model
// was trained on, and the model's tool calls read back out of its text.
//
// One family is implemented, ChatML as the Qwen2 / Qwen2.5 / Qwen3 models use
// it (rendered natively, not by a Jinja interpreter):
//   <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
// Tools are declared in the system turn inside <tools></tools> (one JSON
// object per line); the model calls one as
//   <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>
// and tool results come back in a user turn as <tool_response>...</tool_response>.
// A model directory whose tokenizer_config.json names another template is
// refused with a message (chat_template::from_model_dir).
//
// Message text never becomes a special token: "<|im_end|>" typed by a user is
// encoded as plain text, so a client cannot forge turns.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "areal/kernels/tokenizer.hpp"

namespace areal::kernels {

struct tool_call {
  std::string id;         // "call_..."; made up by the server, echoed back by the client
  std::string name;       // the function's name
  std::string arguments;  // a JSON object, as text
};

struct chat_message {
  std::string role;  // system, user, assistant or tool
  std::string content;
  std::vector<tool_call> tool_calls;  // assistant messages
  std::string tool_call_id;           // tool messages: the call answered
  bool operator==(const chat_message& o) const;
};

/// What a model's text says: its plain content, and the tool calls it made.
struct parsed_reply {
  std::string content;
  std::vector<tool_call> tool_calls;
};

/// Why a template cannot be used; the text says what to do.
struct template_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class chat_template {
 public:
  /// ChatML over this tokenizer; throws template_error when it lacks
  /// <|im_start|> or <|im_end|>. `compact_tools`: tools are declared as the
  /// <tools> block alone, without Qwen's instructions around it (for the
  /// presets, which learn the format from their own demonstrations and pay
  /// for every character of context).
  static chat_template chatml(const tokenizer& tok, bool compact_tools = false);
  /// The template of a Hugging Face model directory (tokenizer_config.json's
  /// chat_template): ChatML when it is one, else template_error.
  static chat_template from_model_dir(const std::string& dir, const tokenizer& tok);

  /// The tokens of `messages` (and of the tool declarations, JSON objects as
  /// text, one per tool), ending with the assistant's opening when
  /// `generation_prompt`. `continuation`: the messages follow a finished
  /// assistant turn whose last token was <|im_end|> (the newline after it comes first).
  std::vector<int32_t> render(const std::vector<chat_message>& messages, const std::vector<std::string>& tools,
                              bool generation_prompt, bool continuation = false) const;
  /// A whole conversation as training data: its tokens, and 1 on the tokens of
  /// the assistant turns (their text and <|im_end|>), 0 on everything else.
  struct transcript {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
  };
  transcript render_transcript(const std::vector<chat_message>& messages, const std::vector<std::string>& tools) const;
  /// Reads the tool calls out of a reply. A malformed <tool_call> block stays
  /// in the content as text; it never throws.
  static parsed_reply parse_reply(const std::string& text);

  const std::string& name() const { return name_; }
  /// The tokens that end an assistant turn (<|im_end|>, and <|endoftext|> where the tokenizer has it).
  const std::vector<int32_t>& stop_tokens() const { return stop_; }

 private:
  chat_template(const tokenizer& tok, std::string name);
  void text(std::vector<int32_t>& out, const std::string& s) const;

  const tokenizer* tok_;
  std::string name_;
  bool compact_tools_ = false;
  int32_t im_start_ = 0, im_end_ = 0;
  std::vector<int32_t> stop_;
};

}  // namespace areal::kernels
