// Reading OpenAI requests and writing responses (see endpoint_openai.hpp).
#include "endpoint_openai.hpp"

#include <set>

#include <fmt/format.h>

namespace areal::openai {

using nlohmann::json;

std::string api_error::type() const {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
    case 500:
      return "server_error";
    default:
      return "invalid_request_error";
  }
}

json api_error::body() const {
  return {{"error",
           {{"message", message},
            {"type", type()},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", nullptr}}}};
}

namespace {

api_error bad(const std::string& param, const std::string& message) {
  return api_error{400, message, param};
}

json parse_body(const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded())
    throw bad("", "the request body is not valid JSON");
  if (!j.is_object())
    throw bad("", "the request body must be a JSON object");
  return j;
}

// Every field of `j` is one of `known`; the first other one is named.
void only_known(const json& j, const std::set<std::string>& known, const std::string& what) {
  for (auto& [key, value] : j.items())
    if (!known.count(key))
      throw bad(key, "unknown field \"" + key + "\" in " + what + " (this server reads: " + [&] {
        std::string list;
        for (auto& k : known)
          list += (list.empty() ? "" : ", ") + k;
        return list;
      }() + ")");
}

double number(const json& j, const char* key, double min, double max) {
  if (!j.is_number())
    throw bad(key, std::string{key} + " must be a number");
  auto x = j.get<double>();
  if (!(x >= min && x <= max))
    throw bad(key,
              std::string{key} + " must be in [" + fmt::format("{:g}", min) + ", " + fmt::format("{:g}", max) + "]");
  return x;
}

int64_t integer(const json& j, const char* key, int64_t min, int64_t max) {
  if (!j.is_number_integer())
    throw bad(key, std::string{key} + " must be an integer");
  auto x = j.get<int64_t>();
  if (x < min || x > max)
    throw bad(key, std::string{key} + " must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return x;
}

bool boolean(const json& j, const char* key) {
  if (!j.is_boolean())
    throw bad(key, std::string{key} + " must be true or false");
  return j.get<bool>();
}

std::string string(const json& j, const char* key) {
  if (!j.is_string())
    throw bad(key, std::string{key} + " must be a string");
  return j.get<std::string>();
}

// Whether object `o` holds `key` as the string `expected`. (json::value with a
// string default throws a type_error, not a 400, when the field is another type.)
bool field_is(const json& o, const char* key, const char* expected) {
  auto it = o.find(key);
  return it != o.end() && it->is_string() && it->get_ref<const std::string&>() == expected;
}

// The fields both kinds of request share; true when `key` was one.
bool read_common(generation_ask& a, const std::string& key, const json& v) {
  if (key == "model") {
    a.model = string(v, "model");
  } else if (key == "temperature") {
    a.temperature = v.is_null() ? 1.0 : number(v, "temperature", 0, 2);
  } else if (key == "top_p") {
    a.top_p = v.is_null() ? 1.0 : number(v, "top_p", 0, 1);
    if (a.top_p <= 0)
      throw bad("top_p", "top_p must be above 0");
  } else if (key == "top_k") {
    a.top_k = v.is_null() ? 0 : integer(v, "top_k", 0, 1 << 30);
  } else if (key == "max_tokens" || key == "max_completion_tokens") {
    if (!v.is_null())
      a.max_tokens = integer(v, key == "max_tokens" ? "max_tokens" : "max_completion_tokens", 1, 1 << 30);
  } else if (key == "n") {
    a.n = v.is_null() ? 1 : integer(v, "n", 1, 128);
  } else if (key == "stop") {
    if (v.is_string()) {
      a.stop = {v.get<std::string>()};
    } else if (v.is_array()) {
      if (v.size() > 4)
        throw bad("stop", "stop takes at most 4 strings");
      for (auto& s : v)
        a.stop.push_back(string(s, "stop"));
    } else if (!v.is_null()) {
      throw bad("stop", "stop must be a string or an array of strings");
    }
    for (auto& s : a.stop)
      if (s.empty())
        throw bad("stop", "a stop string must not be empty");
  } else if (key == "seed") {
    if (!v.is_null())
      a.seed = static_cast<uint64_t>(integer(v, "seed", INT64_MIN, INT64_MAX));
  } else if (key == "stream") {
    a.stream = !v.is_null() && boolean(v, "stream");
  } else if (key == "stream_options") {
    if (!v.is_null()) {
      if (!v.is_object())
        throw bad("stream_options", "stream_options must be an object");
      only_known(v, {"include_usage"}, "stream_options");
      if (v.contains("include_usage"))
        a.include_usage = boolean(v["include_usage"], "include_usage");
    }
  } else if (key == "user") {
    a.user = string(v, "user");
  } else if (key == "frequency_penalty" || key == "presence_penalty") {
    if (!v.is_null() && number(v, key.c_str(), -2, 2) != 0)
      throw bad(key, key + " is not supported by this server (the policy's own distribution is sampled, as "
                           "training needs); leave it 0");
  } else {
    return false;
  }
  return true;
}

std::string content_text(const json& v, const std::string& where) {
  if (v.is_null())
    return {};
  if (v.is_string())
    return v.get<std::string>();
  if (v.is_array()) {
    // Content parts: text only.
    std::string out;
    for (auto& part : v) {
      if (!part.is_object() || !field_is(part, "type", "text") || !part.contains("text") || !part["text"].is_string())
        throw bad(where, where + ": only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw bad(where, where + " must be a string or an array of text parts");
}

kernels::chat_message read_message(const json& m, size_t i) {
  auto where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object())
    throw bad(where, where + " must be an object");
  only_known(m, {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}, where);
  kernels::chat_message out;
  if (!m.contains("role"))
    throw bad(where + ".role", where + " has no role");
  out.role = string(m["role"], "role");
  if (out.role == "developer")
    out.role = "system";
  if (out.role != "system" && out.role != "user" && out.role != "assistant" && out.role != "tool")
    throw bad(where + ".role", where + ".role \"" + out.role + "\" is not system, developer, user, assistant or tool");
  out.content = content_text(m.value("content", json(nullptr)), where + ".content");
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    if (out.role != "assistant" || !m["tool_calls"].is_array())
      throw bad(where + ".tool_calls", where + ".tool_calls must be an array, on an assistant message");
    for (auto& c : m["tool_calls"]) {
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
        throw bad(where + ".tool_calls", where + ": a tool call needs a \"function\" object");
      auto& f = c["function"];
      kernels::tool_call call;
      call.id = c.contains("id") && !c["id"].is_null() ? string(c["id"], "id") : "";
      call.name = f.contains("name") ? string(f["name"], "name") : "";
      call.arguments = f.contains("arguments") ? string(f["arguments"], "arguments") : "{}";
      out.tool_calls.push_back(std::move(call));
    }
  }
  if (out.role == "tool") {
    if (!m.contains("tool_call_id"))
      throw bad(where + ".tool_call_id", where + ": a tool message needs tool_call_id");
    out.tool_call_id = string(m["tool_call_id"], "tool_call_id");
  }
  return out;
}

}  // namespace

chat_request parse_chat(const std::string& body) {
  auto j = parse_body(body);
  chat_request r;
  for (auto& [key, v] : j.items()) {
    if (read_common(r.ask, key, v))
      continue;
    if (key == "messages") {
      if (!v.is_array() || v.empty())
        throw bad("messages", "messages must be a non-empty array");
      for (size_t i = 0; i < v.size(); ++i)
        r.messages.push_back(read_message(v[i], i));
    } else if (key == "tools") {
      if (v.is_null())
        continue;
      if (!v.is_array())
        throw bad("tools", "tools must be an array");
      for (size_t i = 0; i < v.size(); ++i) {
        auto& t = v[i];
        if (!t.is_object() || !field_is(t, "type", "function") || !t.contains("function") ||
            !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
          throw bad("tools", "tools[" + std::to_string(i) +
                                 "] must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}");
        r.tools.push_back(json{{"type", "function"}, {"function", t["function"]}}.dump());
      }
    } else if (key == "tool_choice") {
      if (v.is_null() || (v.is_string() && v.get<std::string>() == "auto"))
        continue;
      if (v.is_string() && v.get<std::string>() == "none") {
        r.tools_enabled = false;
        continue;
      }
      throw bad("tool_choice", "tool_choice \"" + (v.is_string() ? v.get<std::string>() : v.dump()) +
                                   "\" is not supported: this server cannot force a tool call; use \"auto\" or "
                                   "\"none\"");
    } else if (key == "parallel_tool_calls") {
      r.parallel_tool_calls = v.is_null() || boolean(v, "parallel_tool_calls");
    } else if (key == "logprobs") {
      r.ask.logprobs = !v.is_null() && boolean(v, "logprobs");
    } else if (key == "top_logprobs") {
      if (!v.is_null() && integer(v, "top_logprobs", 0, 20) > 0)
        throw bad("top_logprobs", "top_logprobs is not supported (the engine keeps the sampled token's "
                                  "log-probability only); use logprobs: true");
    } else if (key == "store") {
      if (!v.is_null() && boolean(v, "store"))
        throw bad("store", "this server stores no completions; leave store false");
    } else if (key == "metadata") {
      if (!v.is_null() && !v.is_object())
        throw bad("metadata", "metadata must be an object");  // kept with stored completions only: none here
    } else if (key == "response_format") {
      if (!v.is_null() && !(v.is_object() && field_is(v, "type", "text")))
        throw bad("response_format", "only response_format {\"type\": \"text\"} is supported (no constrained "
                                     "decoding)");
    } else {
      only_known(json{{key, v}}, {}, "the request");
    }
  }
  if (r.messages.empty())
    throw bad("messages", "messages is required");
  if (!r.tools_enabled)
    r.tools.clear();
  return r;
}

completion_request parse_completion(const std::string& body) {
  auto j = parse_body(body);
  completion_request r;
  r.ask.max_tokens = 16;  // OpenAI's default for completions
  bool has_prompt = false;
  for (auto& [key, v] : j.items()) {
    if (read_common(r.ask, key, v))
      continue;
    if (key == "prompt") {
      has_prompt = true;
      if (v.is_string()) {
        r.prompt_text = v.get<std::string>();
      } else if (v.is_array() && !v.empty() && v[0].is_number_integer()) {
        for (auto& t : v)
          r.prompt_ids.push_back(static_cast<int32_t>(integer(t, "prompt", 0, INT32_MAX)));
      } else if (v.is_array() && v.size() == 1 && v[0].is_string()) {
        r.prompt_text = v[0].get<std::string>();
      } else {
        throw bad("prompt", "prompt must be a string, or an array of token ids (one prompt per request)");
      }
    } else if (key == "logprobs") {
      if (!v.is_null()) {
        auto k = integer(v, "logprobs", 0, 5);
        if (k > 1)
          throw bad("logprobs", "only logprobs 0 or 1 (the sampled token's) are supported");
        r.ask.logprobs = true;
      }
    } else if (key == "echo") {
      if (!v.is_null() && boolean(v, "echo"))
        throw bad("echo", "echo is not supported; the prompt is what you sent");
    } else if (key == "best_of") {
      if (!v.is_null() && integer(v, "best_of", 1, 128) != 1)
        throw bad("best_of", "best_of other than 1 is not supported; use n");
    } else if (key == "suffix") {
      if (!v.is_null())
        throw bad("suffix", "suffix (insertion) is not supported");
    } else {
      only_known(json{{key, v}}, {}, "the request");
    }
  }
  if (!has_prompt || (r.prompt_text.empty() && r.prompt_ids.empty()))
    throw bad("prompt", "prompt is required and must not be empty");
  return r;
}

kernels::chat_message reply_message(const choice& c, const std::string& call_id_prefix) {
  kernels::chat_message m;
  m.role = "assistant";
  m.content = c.reply.content;
  m.tool_calls = c.reply.tool_calls;
  for (size_t i = 0; i < m.tool_calls.size(); ++i)
    m.tool_calls[i].id = call_id_prefix + "_" + std::to_string(i);
  return m;
}

std::string finish_text(const choice& c) {
  if (!c.reply.tool_calls.empty())
    return "tool_calls";
  return c.finish == finish_reason::length && !c.stopped_by_string ? "length" : "stop";
}

json tool_calls_json(const std::vector<kernels::tool_call>& calls) {
  auto out = json::array();
  for (size_t i = 0; i < calls.size(); ++i)
    out.push_back({{"index", i},
                   {"id", calls[i].id},
                   {"type", "function"},
                   {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  return out;
}

json usage(int64_t prompt_tokens, const std::vector<choice>& choices) {
  int64_t completion = 0;
  for (auto& c : choices)
    completion += static_cast<int64_t>(c.tokens.size());
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens + completion}};
}

json logprobs_json(const choice& c) {
  auto content = json::array();
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    auto& text = c.token_texts[i];
    std::vector<int> bytes(text.begin(), text.end());
    for (auto& b : bytes)
      b &= 0xff;
    content.push_back({{"token", text}, {"logprob", c.logprobs[i]}, {"bytes", bytes}, {"top_logprobs", json::array()}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json chat_response(const std::string& id, const std::string& model, int64_t created,
                   const std::vector<choice>& choices, const std::vector<kernels::chat_message>& replies,
                   int64_t prompt_tokens, bool logprobs) {
  auto list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    auto& c = choices[i];
    auto& m = replies[i];
    json message = {{"role", "assistant"}, {"content", m.content}, {"refusal", nullptr}};
    if (!m.tool_calls.empty())
      message["tool_calls"] = tool_calls_json(m.tool_calls);
    list.push_back({{"index", i},
                    {"message", message},
                    {"logprobs", logprobs ? logprobs_json(c) : json(nullptr)},
                    {"finish_reason", finish_text(c)},
                    {"token_ids", c.tokens},
                    {"token_versions", c.versions}});
  }
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", created},
          {"model", model},
          {"choices", list},
          {"usage", usage(prompt_tokens, choices)}};
}

json completion_response(const std::string& id, const std::string& model, int64_t created,
                         const std::vector<choice>& choices, int64_t prompt_tokens, bool logprobs) {
  auto list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    auto& c = choices[i];
    json lp = nullptr;
    if (logprobs)
      lp = {{"tokens", c.token_texts}, {"token_logprobs", c.logprobs}, {"top_logprobs", nullptr}};
    list.push_back({{"index", i},
                    {"text", c.text},
                    {"logprobs", lp},
                    {"finish_reason", finish_text(c)},
                    {"token_ids", c.tokens},
                    {"token_versions", c.versions}});
  }
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", list},
          {"usage", usage(prompt_tokens, choices)}};
}

std::optional<std::pair<size_t, std::string>> cut_at_stop(const std::vector<std::string>& token_texts,
                                                          const std::vector<std::string>& stops) {
  if (stops.empty())
    return std::nullopt;
  std::string text;
  for (size_t i = 0; i < token_texts.size(); ++i) {
    auto before = text.size();
    text += token_texts[i];
    size_t best = std::string::npos;
    for (auto& s : stops) {
      // Only occurrences that end in this token (earlier ones were found before).
      auto from = before >= s.size() ? before - s.size() + 1 : 0;
      auto at = text.find(s, from);
      if (at != std::string::npos && at < best)
        best = at;
    }
    if (best != std::string::npos)
      return std::make_pair(i + 1, text.substr(0, best));
  }
  return std::nullopt;
}

}  // namespace areal::openai
