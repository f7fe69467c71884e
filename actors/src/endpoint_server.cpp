// The endpoint's HTTP side (see endpoint.hpp): routes, the API key, limits,
// OpenAI error objects and server-sent events (the episode routes' work is
// in endpoint_episodes.cpp).
#include "areal/actors/endpoint.hpp"

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <thread>

#include <sys/socket.h>

#include <httplib.h>

#include <caf/all.hpp>

#include "areal/runtime/log.hpp"
#include "endpoint_calls.hpp"
#include "endpoint_episodes.hpp"

namespace areal {

using nlohmann::json;
using openai::api_error;

struct http_endpoint::impl {
  caf::actor_system& sys;
  endpoint_setup setup;
  httplib::Server server;
  std::unique_ptr<episode_table> episodes;
  episode_routes episode_api{sys, setup, episodes};
  std::thread listener, sweeper;
  std::mutex sweep_mutex;
  std::condition_variable sweep_wake;
  bool stopping = false;
  int bound_port = 0;
  std::atomic<int64_t> pending{0};
  std::atomic<uint64_t> next_worker{0}, next_seed{0}, next_id{0};
  mutable std::mutex count_mutex;
  endpoint_counts counts;

  impl(caf::actor_system& s, endpoint_setup x) : sys(s), setup(std::move(x)) {}

  void count(const std::function<void(endpoint_counts&)>& f) {
    std::lock_guard<std::mutex> lock{count_mutex};
    f(counts);
  }

  void reply_error(httplib::Response& res, const api_error& e) {
    res.status = e.status;
    res.set_content(e.body().dump(), "application/json");
    count([&](endpoint_counts& c) { (e.status >= 500 ? c.server_errors : c.client_errors)++; });
    if (e.status == 429)
      res.set_header("Retry-After", "1");
  }

  std::string new_id(const char* prefix) { return std::string{prefix} + std::to_string(next_id++); }

  // -- model calls --------------------------------------------------------------

  // A place among the pending calls, or 429.
  struct pending_slot {
    impl* owner;
    int64_t n;
    ~pending_slot() { owner->pending -= n; }
  };
  std::unique_ptr<pending_slot> take_pending(int64_t n) {
    if (pending.fetch_add(n) + n > setup.max_pending) {
      pending -= n;
      count([](endpoint_counts& c) { c.busy++; });
      throw api_error{429, "the server is busy: " + std::to_string(setup.max_pending) +
                               " model calls are pending (endpoint.max_pending); retry shortly"};
    }
    return std::unique_ptr<pending_slot>(new pending_slot{this, n});
  }

  endpoint_detail::call_plan plan_for(std::vector<int32_t> prompt, const openai::generation_ask& ask,
                                      std::vector<int32_t> stops, int64_t version) {
    if (!ask.model.empty() && ask.model != setup.model_name)
      throw api_error{404, "the model \"" + ask.model + "\" does not exist here; this endpoint serves \"" +
                               setup.model_name + "\" (GET /v1/models)",
                      "model"};
    auto room = setup.max_seq_len - static_cast<int64_t>(prompt.size());
    if (room < 1)
      throw api_error{400, "the prompt has " + std::to_string(prompt.size()) + " tokens; the model's context is " +
                               std::to_string(setup.max_seq_len) + " tokens",
                      "messages"};
    auto max_tokens = ask.max_tokens > 0 ? ask.max_tokens : std::min(room, setup.default_max_tokens);
    if (max_tokens > room)
      throw api_error{400, "the prompt has " + std::to_string(prompt.size()) + " tokens and max_tokens is " +
                               std::to_string(max_tokens) + "; together they exceed the model's context of " +
                               std::to_string(setup.max_seq_len) + " tokens",
                      "max_tokens"};
    endpoint_detail::call_plan p;
    p.prompt = std::move(prompt);
    p.ask = ask;
    p.stop_tokens = std::move(stops);
    p.max_new_tokens = static_cast<uint32_t>(max_tokens);
    p.seed = ask.seed ? *ask.seed : setup.seed * 0x9E3779B97F4A7C15ull + (next_seed += 1000);
    p.admitted_version = version;
    return p;
  }

  // The tokens, their text and the stop-string cut of each choice.
  void finish_choices(std::vector<openai::choice>& choices, const std::vector<std::string>& stops, bool chat,
                      bool parse_tools) {
    auto& tok = *setup.tokenizer;
    for (auto& c : choices) {
      for (auto t : c.tokens)
        c.token_texts.push_back(tok.decode({t}, true));
      if (auto cut = openai::cut_at_stop(c.token_texts, stops)) {
        c.tokens.resize(cut->first);
        c.logprobs.resize(cut->first);
        c.versions.resize(cut->first);
        c.token_texts.resize(cut->first);
        c.text = cut->second;
        c.stopped_by_string = true;
      } else {
        c.text = tok.decode(c.tokens, true);
      }
      if (chat)
        c.reply = parse_tools ? kernels::chat_template::parse_reply(c.text) : kernels::parsed_reply{c.text, {}};
      else
        c.reply.content = c.text;
      count([&](endpoint_counts& n) {
        n.tokens += static_cast<int64_t>(c.tokens.size());
        n.completed++;
      });
    }
  }

  std::vector<openai::choice> run(const endpoint_detail::call_plan& plan, const endpoint_detail::delta_sink& sink) {
    try {
      return endpoint_detail::run_call(sys, setup.rollouts, next_worker++, plan, setup.request_timeout, sink);
    } catch (const endpoint_detail::call_failed& f) {
      if (f.status == 499 || f.status == 503)
        count([](endpoint_counts& c) { c.cancelled++; });
      throw api_error{f.status == 499 ? 503 : f.status, f.message};
    }
  }

  std::string episode_of(const httplib::Request& req, const openai::generation_ask& ask) {
    if (req.has_header("X-Episode-Id"))
      return req.get_header_value("X-Episode-Id");
    if (ask.user.rfind("ep-", 0) == 0)
      return ask.user;
    return {};
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    if (!setup.chat)
      throw api_error{400, "chat completions need a chat template: " + setup.no_chat_reason +
                               "; /v1/completions works without one"};
    auto r = openai::parse_chat(req.body);
    auto episode = episode_of(req, r.ask);
    if (!episode.empty() && r.ask.n != 1)
      throw api_error{400, "a call of an episode generates one choice (n = 1): an episode is one trajectory", "n"};
    endpoint_detail::call_plan plan;
    bool split = false;
    if (episode.empty()) {
      plan = plan_for(setup.chat->render(r.messages, r.tools, true), r.ask, setup.chat->stop_tokens(), 0);
    } else {
      auto call = call_episode(episode, r);
      split = call.split;
      try {
        plan = plan_for(std::move(call.context), r.ask, setup.chat->stop_tokens(), call.admitted_version);
      } catch (...) {
        episodes->abort_call(episode);
        throw;
      }
    }
    auto slot = take_pending(r.ask.n);
    auto id = new_id("chatcmpl-");
    auto created = static_cast<int64_t>(std::time(nullptr));
    bool parse_tools = !r.tools.empty();
    if (!r.ask.stream) {
      std::vector<openai::choice> choices;
      try {
        choices = run(plan, {});
      } catch (...) {
        if (!episode.empty())
          episodes->abort_call(episode);
        throw;
      }
      finish_choices(choices, r.ask.stop, true, parse_tools);
      std::vector<kernels::chat_message> replies;
      for (auto& c : choices) {
        replies.push_back(openai::reply_message(c, "call_" + id.substr(9)));
        if (!r.parallel_tool_calls && replies.back().tool_calls.size() > 1)
          replies.back().tool_calls.resize(1);
      }
      if (!episode.empty())
        episodes->finish_call(episode, {choices[0].tokens, choices[0].logprobs, choices[0].versions,
                                        choices[0].finish, replies[0]});
      auto body = openai::chat_response(id, setup.model_name, created, choices, replies,
                                        static_cast<int64_t>(plan.prompt.size()), r.ask.logprobs);
      if (split)
        body["episode_split"] = true;
      res.set_content(body.dump(), "application/json");
      return;
    }
    stream_chat(res, std::move(slot), plan, r, episode, id, created);
  }

  episode_call call_episode(const std::string& episode, const openai::chat_request& r) {
    try {
      return episodes->begin_call(episode, r.messages, r.tools);
    } catch (const episode_error& e) {
      throw api_error{e.status, e.what()};
    }
  }

  void stream_chat(httplib::Response& res, std::unique_ptr<pending_slot> slot, endpoint_detail::call_plan plan,
                   openai::chat_request r, std::string episode, std::string id, int64_t created) {
    auto shared_slot = std::shared_ptr<pending_slot>(std::move(slot));
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [this, shared_slot, plan, r, episode, id, created](size_t, httplib::DataSink& sink) {
          auto chunk = [&](json choices, json extra = nullptr) {
            json c = {{"id", id},
                      {"object", "chat.completion.chunk"},
                      {"created", created},
                      {"model", setup.model_name},
                      {"choices", choices}};
            if (!extra.is_null())
              c.update(extra);
            auto text = "data: " + c.dump() + "\n\n";
            return sink.write(text.data(), text.size());
          };
          bool buffered = !r.tools.empty() || !r.ask.stop.empty();  // tool calls and stop strings need the whole text
          for (int64_t i = 0; i < r.ask.n; ++i)
            chunk(json::array({{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                {"finish_reason", nullptr}}}));
          std::vector<std::vector<int32_t>> so_far(static_cast<size_t>(r.ask.n));
          std::vector<size_t> sent_chars(so_far.size(), 0);
          auto on_delta = [&](size_t k, const std::vector<int32_t>& tokens) {
            if (!sink.is_writable())
              return false;
            so_far[k].insert(so_far[k].end(), tokens.begin(), tokens.end());
            if (buffered)
              return true;
            auto text = setup.tokenizer->decode(so_far[k], true);
            // A multi-byte character may be cut at the end: hold its bytes back.
            auto safe = text.size();
            while (safe > 0 && (static_cast<unsigned char>(text[safe - 1]) & 0xC0) == 0x80)
              --safe;
            if (safe > 0 && static_cast<unsigned char>(text[safe - 1]) >= 0xC0)
              --safe;
            if (safe <= sent_chars[k])
              return true;
            auto piece = text.substr(sent_chars[k], safe - sent_chars[k]);
            sent_chars[k] = safe;
            return chunk(json::array({{{"index", k}, {"delta", {{"content", piece}}}, {"finish_reason", nullptr}}}));
          };
          std::vector<openai::choice> choices;
          try {
            choices = run(plan, on_delta);
          } catch (const api_error& e) {
            if (!episode.empty())
              episodes->abort_call(episode);
            auto text = "data: " + e.body().dump() + "\n\n";
            sink.write(text.data(), text.size());
            sink.done();
            return true;
          }
          finish_choices(choices, r.ask.stop, true, !r.tools.empty());
          for (size_t k = 0; k < choices.size(); ++k) {
            auto& c = choices[k];
            auto reply = openai::reply_message(c, "call_" + id.substr(9));
            if (!r.parallel_tool_calls && reply.tool_calls.size() > 1)
              reply.tool_calls.resize(1);
            if (k == 0 && !episode.empty())
              episodes->finish_call(episode, {c.tokens, c.logprobs, c.versions, c.finish, reply});
            json delta = json::object();
            auto rest = buffered ? reply.content : c.text.substr(std::min(sent_chars[k], c.text.size()));
            if (!rest.empty())
              delta["content"] = rest;
            if (!reply.tool_calls.empty())
              delta["tool_calls"] = openai::tool_calls_json(reply.tool_calls);
            json last = {{"index", k},
                         {"delta", delta},
                         {"finish_reason", openai::finish_text(c)},
                         {"token_ids", c.tokens},
                         {"token_versions", c.versions}};
            if (r.ask.logprobs)
              last["logprobs"] = openai::logprobs_json(c);
            chunk(json::array({last}));
          }
          if (r.ask.include_usage)
            chunk(json::array(), {{"usage", openai::usage(static_cast<int64_t>(plan.prompt.size()), choices)}});
          std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        });
  }

  void completion(const httplib::Request& req, httplib::Response& res) {
    auto r = openai::parse_completion(req.body);
    if (r.ask.stream)
      throw api_error{400, "stream is supported on /v1/chat/completions; /v1/completions answers whole", "stream"};
    auto prompt = r.prompt_ids.empty() ? setup.tokenizer->encode(r.prompt_text) : r.prompt_ids;
    for (auto t : prompt)
      if (t >= setup.tokenizer->vocab_size())
        throw api_error{400, "token id " + std::to_string(t) + " is past the vocabulary (" +
                                 std::to_string(setup.tokenizer->vocab_size()) + ")",
                        "prompt"};
    auto plan = plan_for(prompt, r.ask, {setup.eos}, 0);
    auto slot = take_pending(r.ask.n);
    auto choices = run(plan, {});
    finish_choices(choices, r.ask.stop, false, false);
    auto body = openai::completion_response(new_id("cmpl-"), setup.model_name, static_cast<int64_t>(std::time(nullptr)),
                                            choices, static_cast<int64_t>(prompt.size()), r.ask.logprobs);
    res.set_content(body.dump(), "application/json");
  }

  // -- the server -------------------------------------------------------------------

  using route = std::function<void(const httplib::Request&, httplib::Response&)>;
  httplib::Server::Handler guarded(route f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      count([](endpoint_counts& c) { c.requests++; });
      try {
        f(req, res);
      } catch (const api_error& e) {
        reply_error(res, e);
      } catch (const std::exception& e) {
        reply_error(res, api_error{500, std::string{"internal error: "} + e.what()});
      }
    };
  }

  void routes() {
    auto models = [this] {
      return json{{"id", setup.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "areal"}};
    };
    server.Get("/v1/models", guarded([=](auto&, auto& res) {
                 res.set_content(json{{"object", "list"}, {"data", json::array({models()})}}.dump(),
                                 "application/json");
               }));
    server.Get(R"(/v1/models/([^/]+))", guarded([=](const httplib::Request& req, auto& res) {
                 if (req.matches[1] != setup.model_name)
                   throw api_error{404, "the model \"" + std::string{req.matches[1]} + "\" does not exist here"};
                 res.set_content(models().dump(), "application/json");
               }));
    server.Post("/v1/chat/completions", guarded([this](auto& req, auto& res) { chat(req, res); }));
    server.Post("/v1/completions", guarded([this](auto& req, auto& res) { completion(req, res); }));
    server.Post("/rl/episodes", guarded([this](auto& req, auto& res) {
                  res.set_content(episode_api.open(req.body).dump(), "application/json");
                }));
    server.Post(R"(/rl/episodes/([^/]+)/reward)", guarded([this](const httplib::Request& req, auto& res) {
                  res.set_content(episode_api.reward(req.matches[1], req.body).dump(), "application/json");
                }));
    server.Post(R"(/rl/episodes/([^/]+)/end)", guarded([this](const httplib::Request& req, auto& res) {
                  res.set_content(episode_api.end(req.matches[1], req.body).dump(), "application/json");
                }));
    server.Get("/health", guarded([this](auto&, auto& res) {
                 auto c = snapshot();
                 res.set_content(json{{"status", "ok"},
                                      {"pending", pending.load()},
                                      {"requests", c.requests},
                                      {"episodes_open", c.episodes.open},
                                      {"episodes_ended", c.episodes.ended},
                                      {"episodes_dropped", c.episodes.dropped},
                                      {"episode_splits", c.episodes.splits}}
                                     .dump(),
                                 "application/json");
               }));
    // Everything else, and what the library refuses before a handler (413): OpenAI error objects.
    server.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty())
        return;  // a handler's own error object
      std::string message = res.status == 413 ? "the request body exceeds " +
                                                    std::to_string(setup.max_body_bytes / 1024) +
                                                    " KiB (endpoint.max_body_kb)"
                            : res.status == 404 ? "no route " + req.method + " " + req.path
                                                : "the request could not be served (HTTP " +
                                                      std::to_string(res.status) + ")";
      reply_error(res, api_error{res.status, message});
    });
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (setup.api_key.empty() || req.path == "/health")
        return httplib::Server::HandlerResponse::Unhandled;
      auto given = req.get_header_value("Authorization");
      auto expected = "Bearer " + setup.api_key;
      // Compared in time independent of where they differ.
      unsigned char diff = given.size() == expected.size() ? 0 : 1;
      for (size_t i = 0; i < given.size() && i < expected.size(); ++i)
        diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
      if (diff == 0)
        return httplib::Server::HandlerResponse::Unhandled;
      count([](endpoint_counts& c) { c.requests++; });
      reply_error(res, api_error{401, "missing or wrong API key: send \"Authorization: Bearer KEY\""});
      return httplib::Server::HandlerResponse::Handled;
    });
  }

  endpoint_counts snapshot() const {
    std::lock_guard<std::mutex> lock{count_mutex};
    auto c = counts;
    if (episodes)
      c.episodes = episodes->counts();
    return c;
  }

  void sweep_loop() {
    std::unique_lock<std::mutex> lock{sweep_mutex};
    while (!stopping && episodes) {
      sweep_wake.wait_for(lock, std::chrono::milliseconds(200));
      for (auto& c : episodes->expire(episode_table::clock::now())) {
        spdlog::info("endpoint: episode {} dropped: {}", c.id, c.drop_reason);
        episode_api.tell_dropped(c);
      }
    }
  }
};

http_endpoint::http_endpoint(caf::actor_system& sys, endpoint_setup setup)
    : impl_(std::make_unique<impl>(sys, std::move(setup))) {
  auto& m = *impl_;
  if (!m.setup.tokenizer)
    throw std::runtime_error("the endpoint needs the model's tokenizer");
  if (m.setup.chat)  // episodes are chats: none without a template
    m.episodes = std::make_unique<episode_table>(*m.setup.chat, m.setup.episode_timeout, m.setup.name);
  auto threads = static_cast<size_t>(m.setup.threads);
  m.server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  m.server.set_payload_max_length(m.setup.max_body_bytes);
  m.server.set_read_timeout(10, 0);
  m.server.set_write_timeout(10, 0);
  m.server.set_keep_alive_timeout(5);
  m.routes();
  // Debian's cpp-httplib is a compiled library that listens with a backlog of
  // 5: agents opening many connections at once while the cores generate
  // overflowed it (the kernel drops such a connection after the client sent
  // its request: "Read" errors). The listening socket gets a real backlog.
  std::atomic<int> listening{-1};
  m.server.set_socket_options([&listening](socket_t fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listening = fd;
  });
  m.bound_port = m.setup.port == 0 ? m.server.bind_to_any_port(m.setup.host)
                                   : (m.server.bind_to_port(m.setup.host, m.setup.port) ? m.setup.port : -1);
  if (m.bound_port <= 0)
    throw std::runtime_error("the endpoint cannot listen on " + m.setup.host + ":" + std::to_string(m.setup.port) +
                             " (in use, or not an address of this machine); choose another http_port");
  if (listening >= 0)
    ::listen(listening, 1024);
  m.server.set_socket_options([](socket_t) {});
  m.listener = std::thread([this] { impl_->server.listen_after_bind(); });
  m.sweeper = std::thread([this] { impl_->sweep_loop(); });
  spdlog::info("endpoint: serving model \"{}\" at http://{}:{}/v1{}", m.setup.model_name, m.setup.host, m.bound_port,
               m.setup.api_key.empty() ? "" : " (API key required)");
}

http_endpoint::~http_endpoint() {
  stop();
}

uint16_t http_endpoint::port() const {
  return static_cast<uint16_t>(impl_->bound_port);
}

void http_endpoint::stop() {
  auto& m = *impl_;
  {
    std::lock_guard<std::mutex> lock{m.sweep_mutex};
    if (m.stopping)
      return;
    m.stopping = true;
  }
  m.sweep_wake.notify_all();
  m.server.stop();
  if (m.listener.joinable())
    m.listener.join();
  if (m.sweeper.joinable())
    m.sweeper.join();
  if (m.episodes)
    for (auto& c : m.episodes->drop_all("the endpoint stopped"))
      m.episode_api.tell_dropped(c);
}

endpoint_counts http_endpoint::counts() const {
  return impl_->snapshot();
}

}  // namespace areal
