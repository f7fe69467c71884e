// The OpenAI wire format of the endpoint: requests read strictly (a wrong
// type, an unknown field or a value this server cannot honour is an error
// that names it), responses and error objects written. Internal to actors/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "areal/kernels/chat_template.hpp"
#include "areal/messages/records.hpp"

namespace areal::openai {

/// An error answered to the client: HTTP status and OpenAI's error object.
struct api_error {
  api_error(int http_status, std::string what, std::string field = {})
      : status(http_status), message(std::move(what)), param(std::move(field)) {}
  int status = 400;
  std::string message;
  std::string param;  // the offending field, when there is one
  std::string type() const;
  nlohmann::json body() const;
};

/// One generation as the client asked for it (chat or plain completion).
struct generation_ask {
  std::string model;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int64_t max_tokens = -1;  // -1: not given
  int64_t n = 1;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  bool logprobs = false;
  bool stream = false;
  bool include_usage = false;
  std::string user;
};

struct chat_request {
  generation_ask ask;
  std::vector<kernels::chat_message> messages;
  std::vector<std::string> tools;  // each tool's JSON, canonical
  bool tools_enabled = true;       // tool_choice "none": tools are neither shown nor parsed
  bool parallel_tool_calls = true;
};

struct completion_request {
  generation_ask ask;
  std::string prompt_text;           // the prompt as text, or
  std::vector<int32_t> prompt_ids;   // as token ids
};

/// Throw api_error naming the field.
chat_request parse_chat(const std::string& body);
completion_request parse_completion(const std::string& body);

/// One choice's output.
struct choice {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int64_t> versions;
  std::vector<std::string> token_texts;  // each token decoded alone (for logprobs)
  std::string text;                      // decoded, cut at a stop string
  finish_reason finish = finish_reason::stop;
  bool stopped_by_string = false;
  kernels::parsed_reply reply;  // chat: content and tool calls
};

/// The message returned for a chat choice (what the client sends back next turn).
kernels::chat_message reply_message(const choice& c, const std::string& call_id_prefix);
/// OpenAI's finish_reason of a choice.
std::string finish_text(const choice& c);

/// The response objects; every choice also carries the exact token ids and
/// the policy version of each ("token_ids", "token_versions": an extension).
nlohmann::json chat_response(const std::string& id, const std::string& model, int64_t created,
                             const std::vector<choice>& choices, const std::vector<kernels::chat_message>& replies,
                             int64_t prompt_tokens, bool logprobs);
nlohmann::json completion_response(const std::string& id, const std::string& model, int64_t created,
                                   const std::vector<choice>& choices, int64_t prompt_tokens, bool logprobs);
nlohmann::json usage(int64_t prompt_tokens, const std::vector<choice>& choices);
nlohmann::json logprobs_json(const choice& c);
nlohmann::json tool_calls_json(const std::vector<kernels::tool_call>& calls);

/// Where the text of `tokens` must be cut for the first stop string: the number
/// of tokens kept (the stop string completes in the last one) and the text
/// before the stop string; nothing when no stop string occurs.
std::optional<std::pair<size_t, std::string>> cut_at_stop(const std::vector<std::string>& token_texts,
                                                          const std::vector<std::string>& stops);

}  // namespace areal::openai
