// ChatML rendering and tool-call parsing (see chat_template.hpp).
#include "areal/kernels/chat_template.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace areal::kernels {

bool chat_message::operator==(const chat_message& o) const {
  if (role != o.role || content != o.content || tool_call_id != o.tool_call_id ||
      tool_calls.size() != o.tool_calls.size())
    return false;
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    auto& a = tool_calls[i];
    auto& b = o.tool_calls[i];
    // Arguments compare as JSON: a client may re-serialize them with other spacing.
    auto ja = nlohmann::json::parse(a.arguments, nullptr, false);
    auto jb = nlohmann::json::parse(b.arguments, nullptr, false);
    bool same_arguments = ja.is_discarded() || jb.is_discarded() ? a.arguments == b.arguments : ja == jb;
    if (a.name != b.name || !same_arguments)
      return false;
  }
  return true;
}

chat_template::chat_template(const tokenizer& tok, std::string name) : tok_(&tok), name_(std::move(name)) {}

chat_template chat_template::chatml(const tokenizer& tok, bool compact_tools) {
  chat_template t{tok, compact_tools ? "chatml-compact-tools" : "chatml"};
  t.compact_tools_ = compact_tools;
  auto start = tok.token_id("<|im_start|>");
  auto end = tok.token_id("<|im_end|>");
  if (!start || !end)
    throw template_error(
        "the tokenizer has no <|im_start|> / <|im_end|> tokens, so it cannot render ChatML; use a model of the "
        "Qwen2 family, or a preset (task.kind = \"agent\" gives presets these tokens)");
  t.im_start_ = *start;
  t.im_end_ = *end;
  t.stop_.push_back(*end);
  if (auto eot = tok.token_id("<|endoftext|>"))
    t.stop_.push_back(*eot);
  return t;
}

chat_template chat_template::from_model_dir(const std::string& dir, const tokenizer& tok) {
  auto path = dir + "/tokenizer_config.json";
  std::ifstream in{path};
  if (!in)
    throw template_error(path +
                         ": missing; the endpoint takes the chat template from it (a Qwen2-family model "
                         "directory has one)");
  std::ostringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw template_error(path + ": not a JSON object");
  auto it = j.find("chat_template");
  if (it == j.end() || !it->is_string())
    throw template_error(path + ": has no chat_template string; the endpoint needs a ChatML model (Qwen2 family)");
  auto source = it->get<std::string>();
  if (source.find("<|im_start|>") == std::string::npos)
    throw template_error(path +
                         ": its chat_template is not ChatML; this build renders ChatML only (Qwen2, Qwen2.5, "
                         "Qwen3). Serve a ChatML model, or train on built-in prompts instead of an endpoint");
  return chatml(tok);
}

void chat_template::text(std::vector<int32_t>& out, const std::string& s) const {
  auto ids = tok_->encode(s, false);
  out.insert(out.end(), ids.begin(), ids.end());
}

namespace {

std::string tools_block(const std::vector<std::string>& tools, bool compact) {
  if (compact) {
    std::string s = "<tools>";
    for (auto& t : tools)
      s += "\n" + t;
    return s + "\n</tools>";
  }
  std::string s =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
      "function signatures within <tools></tools> XML tags:\n<tools>";
  for (auto& t : tools)
    s += "\n" + t;
  s +=
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call>";
  return s;
}

std::string call_text(const tool_call& c) {
  auto args = nlohmann::json::parse(c.arguments, nullptr, false);
  nlohmann::json call = {{"name", c.name}, {"arguments", args.is_discarded() ? nlohmann::json(c.arguments) : args}};
  return "<tool_call>\n" + call.dump() + "\n</tool_call>";
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos)
    return {};
  auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::vector<int32_t> chat_template::render(const std::vector<chat_message>& messages,
                                           const std::vector<std::string>& tools, bool generation_prompt,
                                           bool continuation) const {
  std::vector<int32_t> out;
  if (continuation)
    text(out, "\n");
  auto open = [&](const std::string& role) {
    out.push_back(im_start_);
    text(out, role + "\n");
  };
  auto close = [&] {
    out.push_back(im_end_);
    text(out, "\n");
  };
  size_t i = 0;
  if (!tools.empty()) {
    open("system");
    bool has_system = !messages.empty() && messages[0].role == "system";
    text(out, (has_system ? messages[0].content + "\n\n" : std::string{}) + tools_block(tools, compact_tools_));
    close();
    i = has_system ? 1 : 0;
  }
  for (; i < messages.size(); ++i) {
    auto& m = messages[i];
    if (m.role == "tool") {
      // Consecutive tool results share one user turn.
      bool first = i == 0 || messages[i - 1].role != "tool";
      bool last = i + 1 == messages.size() || messages[i + 1].role != "tool";
      if (first)
        open("user");
      else
        text(out, "\n");
      text(out, "<tool_response>\n" + m.content + "\n</tool_response>");
      if (last)
        close();
      continue;
    }
    open(m.role);
    std::string body = m.content;
    for (auto& c : m.tool_calls)
      body += (body.empty() ? "" : "\n") + call_text(c);
    text(out, body);
    close();
  }
  if (generation_prompt)
    open("assistant");
  return out;
}

chat_template::transcript chat_template::render_transcript(const std::vector<chat_message>& messages,
                                                            const std::vector<std::string>& tools) const {
  transcript t;
  auto newline = tok_->encode("\n", false).size();
  auto append = [&](const std::vector<int32_t>& ids, size_t from, size_t to, uint8_t mask) {
    t.tokens.insert(t.tokens.end(), ids.begin() + static_cast<std::ptrdiff_t>(from),
                    ids.begin() + static_cast<std::ptrdiff_t>(to));
    t.mask.insert(t.mask.end(), to - from, mask);
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant")
      continue;
    std::vector<chat_message> head(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
    auto before = render(head, tools, true);
    head.push_back(messages[i]);
    auto after = render(head, tools, false);
    // The turn is the generation prompt's continuation: its body and <|im_end|>, then a newline.
    if (after.size() < before.size() + newline + 1 || !std::equal(before.begin(), before.end(), after.begin()) ||
        before.size() < t.tokens.size() || !std::equal(t.tokens.begin(), t.tokens.end(), before.begin()))
      throw template_error("message " + std::to_string(i) + " does not render as a continuation of the ones before");
    append(before, t.tokens.size(), before.size(), 0);
    append(after, before.size(), after.size() - newline, 1);
    append(after, after.size() - newline, after.size(), 0);
  }
  auto all = render(messages, tools, false);
  if (all.size() < t.tokens.size() || !std::equal(t.tokens.begin(), t.tokens.end(), all.begin()))
    throw template_error("the transcript does not render as the continuation of its assistant turns");
  append(all, t.tokens.size(), all.size(), 0);
  return t;
}

parsed_reply chat_template::parse_reply(const std::string& text) {
  static const std::string open = "<tool_call>", close = "</tool_call>";
  parsed_reply r;
  std::string content;
  size_t pos = 0;
  while (true) {
    auto b = text.find(open, pos);
    if (b == std::string::npos)
      break;
    auto e = text.find(close, b + open.size());
    if (e == std::string::npos)
      break;
    auto inner = trim(text.substr(b + open.size(), e - b - open.size()));
    auto j = nlohmann::json::parse(inner, nullptr, false);
    bool ok = !j.is_discarded() && j.is_object() && j.contains("name") && j["name"].is_string() &&
              !j["name"].get<std::string>().empty() && (!j.contains("arguments") || j["arguments"].is_object());
    content += text.substr(pos, b - pos);
    if (ok) {
      tool_call c;
      c.name = j["name"].get<std::string>();
      c.arguments = j.contains("arguments") ? j["arguments"].dump() : "{}";
      r.tool_calls.push_back(std::move(c));
    } else {
      content += text.substr(b, e + close.size() - b);  // malformed: the model's text, as it wrote it
    }
    pos = e + close.size();
  }
  content += text.substr(pos);
  r.content = trim(content);
  return r;
}

}  // namespace areal::kernels
