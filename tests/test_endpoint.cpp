// The OpenAI-compatible endpoint over real sockets on loopback: requests
// answered through a rollout worker with the exact token ids and versions,
// streaming, and bad input answered with OpenAI errors while the node keeps
// serving (malformed JSON, wrong types, unknown fields, a 100 MB body, a
// missing key, a client that disconnects mid-stream, 1,000 connections).
#include <caf/all.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "actor_test_system.hpp"
#include "areal/actors/endpoint.hpp"
#include "areal/actors/rollout.hpp"
#include "test_models.hpp"
#include "torch_doctest.hpp"

using namespace areal;
using namespace areal::kernels;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<const tokenizer> chat_tokenizer() {
  std::string ascii = "\n";
  for (char c = ' '; c <= '~'; ++c)
    ascii += c;
  return std::make_shared<const tokenizer>(
      tokenizer::character_level(ascii, {"<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"}));
}

struct fixture : test::actor_test_system {
  std::shared_ptr<const tokenizer> tok = chat_tokenizer();
  rollout_actor worker;
  std::unique_ptr<http_endpoint> endpoint;

  explicit fixture(std::function<void(endpoint_setup&)> adjust = {}) {
    auto config = test::small_model_config(tok->vocab_size(), 512);
    auto model = std::make_shared<policy_model>(config);
    model->init_random(3, 0.3);
    rollout_setup rs;
    rs.name = "rollout-test";
    rs.model = model;
    rs.tokenizer = tok;
    rs.engine = {8, 512, 64};
    rs.initial_version = 5;
    worker = spawn_rollout(*sys, rs);
    endpoint_setup es;
    es.rollouts = {worker};
    es.tokenizer = tok;
    es.chat = std::make_shared<const chat_template>(chat_template::chatml(*tok, true));
    es.eos = *tok->token_id("<|endoftext|>");
    es.max_seq_len = 512;
    es.default_max_tokens = 16;
    es.request_timeout = 20s;
    if (adjust)
      adjust(es);
    endpoint = std::make_unique<http_endpoint>(*sys, es);
  }
  ~fixture() {
    endpoint->stop();
    (*self)->send_exit(worker, caf::exit_reason::user_shutdown);
  }
  httplib::Client client() const {
    httplib::Client c{"127.0.0.1", endpoint->port()};
    c.set_read_timeout(30, 0);
    return c;
  }
  json post(const std::string& path, const std::string& body, int expect) const {
    auto c = client();
    auto r = c.Post(path, body, "application/json");
    REQUIRE(r);
    CHECK(r->status == expect);
    auto j = json::parse(r->body, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    return j;
  }
};

std::string chat_body(const std::string& extra = {}) {
  return R"({"model": "areal", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6)" + extra + "}";
}

// A connection of our own: send raw bytes, read what comes back.
int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (int i = 0; i < 10000; ++i) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

TEST_CASE("The endpoint answers OpenAI requests through the rollout worker, with the exact tokens and versions") {
  fixture f;
  auto models = f.client().Get("/v1/models");
  REQUIRE(models);
  CHECK(json::parse(models->body)["data"][0]["id"] == "areal");

  auto r = f.post("/v1/chat/completions", chat_body(R"(, "seed": 7, "logprobs": true)"), 200);
  auto& choice = r["choices"][0];
  auto ids = choice["token_ids"].get<std::vector<int32_t>>();
  CHECK(ids.size() == r["usage"]["completion_tokens"].get<size_t>());
  CHECK(!ids.empty());
  for (auto v : choice["token_versions"])
    CHECK(v == 5);  // the worker's policy version
  CHECK(choice["logprobs"]["content"].size() == ids.size());
  CHECK(choice["message"]["content"] == f.tok->decode(ids, true));
  CHECK(r["usage"]["prompt_tokens"] ==
        chat_template::chatml(*f.tok, true).render({{"user", "hi", {}, {}}}, {}, true).size());
  // Same seed, same weights: same tokens.
  auto again = f.post("/v1/chat/completions", chat_body(R"(, "seed": 7)"), 200);
  CHECK(again["choices"][0]["token_ids"] == choice["token_ids"]);

  SUBCASE("n choices, plain completions, stop strings") {
    auto two = f.post("/v1/chat/completions", chat_body(R"(, "n": 2, "seed": 1)"), 200);
    CHECK(two["choices"].size() == 2);
    auto c = f.post("/v1/completions", R"({"prompt": "1+1=", "max_tokens": 5, "logprobs": 1})", 200);
    CHECK(c["choices"][0]["token_ids"].size() == c["choices"][0]["logprobs"]["token_logprobs"].size());
    auto text = f.post("/v1/chat/completions", chat_body(R"(, "seed": 7, "max_tokens": 12)"), 200);
    auto full = text["choices"][0]["message"]["content"].get<std::string>();
    REQUIRE(full.size() >= 3);
    auto stop = full.substr(2, 1);
    auto cut = f.post("/v1/chat/completions",
                      chat_body(R"(, "seed": 7, "max_tokens": 12, "stop": [")" + (stop == "\"" ? "\\\"" : stop == "\\" ? "\\\\" : stop) + "\"]"), 200);
    CHECK(cut["choices"][0]["message"]["content"] == full.substr(0, full.find(stop)));
    CHECK(cut["choices"][0]["finish_reason"] == "stop");
  }
  SUBCASE("a stream's deltas add up to the reply, and its last chunk carries the token ids") {
    auto c = f.client();
    std::string body;
    auto res = c.Post("/v1/chat/completions", chat_body(R"(, "seed": 7, "stream": true)"), "application/json");
    REQUIRE(res);
    CHECK(res->status == 200);
    std::string text;
    json last;
    size_t events = 0;
    std::istringstream in{res->body};
    std::string line;
    bool done = false;
    while (std::getline(in, line)) {
      if (line.rfind("data: ", 0) != 0)
        continue;
      if (line == "data: [DONE]") {
        done = true;
        break;
      }
      auto chunk = json::parse(line.substr(6));
      ++events;
      auto& delta = chunk["choices"][0]["delta"];
      if (delta.contains("content"))
        text += delta["content"].get<std::string>();
      last = chunk;
    }
    CHECK(done);
    CHECK(events >= 3);  // the opening, one per step, the last
    CHECK(text == choice["message"]["content"].get<std::string>());
    CHECK(last["choices"][0]["token_ids"] == choice["token_ids"]);
  }
}

TEST_CASE("Bad requests get OpenAI error objects, and the endpoint keeps serving") {
  fixture f{[](endpoint_setup& es) { es.max_body_bytes = 64 * 1024; }};
  auto error_of = [&](const std::string& body, int status) {
    auto j = f.post("/v1/chat/completions", body, status);
    REQUIRE(j.contains("error"));
    CHECK(j["error"]["message"].is_string());
    return j["error"];
  };
  CHECK(error_of("{not json", 400)["message"] == "the request body is not valid JSON");
  CHECK(error_of("[1, 2]", 400)["type"] == "invalid_request_error");
  CHECK(error_of(chat_body(R"(, "temperature": "hot")"), 400)["param"] == "temperature");
  CHECK(error_of(chat_body(R"(, "temperature": -1)"), 400)["message"] == "temperature must be in [0, 2]");
  CHECK(error_of(chat_body(R"(, "frobnicate": true)"), 400)["param"] == "frobnicate");
  CHECK(error_of(R"({"messages": [{"role": "wizard", "content": "x"}]})", 400)["param"] == "messages[0].role");
  CHECK(error_of(R"({"messages": []})", 400)["param"] == "messages");
  CHECK(error_of(chat_body(R"(, "top_logprobs": 3)"), 400)["param"] == "top_logprobs");
  CHECK(error_of(chat_body(R"(, "tool_choice": "required")"), 400)["param"] == "tool_choice");
  CHECK(error_of(chat_body(R"(, "max_tokens": 100000)"), 400)["param"] == "max_tokens");
  // A field of another type where a string is looked for is a 400 naming it, not a server error
  // (a fuzzer found tools[0].type as an object ending the parse with a JSON type error).
  CHECK(error_of(chat_body(R"(, "tools": [{"type": {"name": "calc"}, "function": {"name": "calc"}}])"), 400)["param"] ==
        "tools");
  CHECK(error_of(R"({"messages": [{"role": "user", "content": [{"type": 7, "text": "x"}]}]})", 400)["param"] ==
        "messages[0].content");
  CHECK(error_of(R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": {}, "function": )"
                 R"({"name": "calc", "arguments": "{}"}}]}]})",
                 400)["param"] == "id");
  CHECK(error_of(chat_body(R"(, "response_format": {"type": ["text"]})"), 400)["param"] == "response_format");
  CHECK(error_of(R"({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})", 404)["param"] == "model");
  CHECK(f.post("/v1/nothing", "{}", 404)["error"]["message"] == "no route POST /v1/nothing");
  // A body over the limit (here 64 KiB; 100 MB sent) is refused without being kept.
  std::string huge(100u << 20, 'x');
  auto big = f.client().Post("/v1/chat/completions", huge, "application/json");
  if (big)  // the server may also close the connection while the client still sends
    CHECK(big->status == 413);
  auto closed = f.post("/rl/episodes", R"({"task": "t"})", 400);  // no controller here: model calls only
  CHECK(closed["error"]["message"].get<std::string>().find("model calls only") != std::string::npos);
  // Still serving.
  f.post("/v1/chat/completions", chat_body(), 200);
  auto counts = f.endpoint->counts();
  CHECK(counts.client_errors >= 12);
  CHECK(counts.server_errors == 0);
}

TEST_CASE("An endpoint with an API key refuses requests without it") {
  fixture f{[](endpoint_setup& es) { es.api_key = "0123456789abcdef-key"; }};
  auto c = f.client();
  auto none = c.Get("/v1/models");
  REQUIRE(none);
  CHECK(none->status == 401);
  CHECK(json::parse(none->body)["error"]["type"] == "authentication_error");
  c.set_bearer_token_auth("0123456789abcdef-wrong");
  CHECK(c.Get("/v1/models")->status == 401);
  c.set_bearer_token_auth("0123456789abcdef-key");
  CHECK(c.Get("/v1/models")->status == 200);
}

TEST_CASE("A client that goes away mid-stream frees its generation, and 1,000 connections at once are all answered") {
  fixture f{[](endpoint_setup& es) {
    es.max_pending = 64;
    es.threads = 32;
  }};
  // Ask for a long streamed reply and hang up at once. (Hanging up after reading the first event raced:
  // on a loaded machine the client woke after the whole reply had been written into the socket's buffers,
  // and nothing was left to stop. Closed at once, the server finds the client gone at its first writes.)
  int fd = connect_to(f.endpoint->port());
  REQUIRE(fd >= 0);
  auto body = chat_body(R"(, "stream": true, "max_tokens": 400, "seed": 3)");
  auto request = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n" + body;
  REQUIRE(::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size()));
  ::close(fd);
  for (int i = 0; i < 200 && f.endpoint->counts().cancelled == 0; ++i)
    std::this_thread::sleep_for(50ms);
  CHECK(f.endpoint->counts().cancelled == 1);  // stopped early, not generated to its end

  // 1,000 connections, each asking for the model list and closing.
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 8192);
  setrlimit(RLIMIT_NOFILE, &lim);
  REQUIRE(lim.rlim_cur >= 2200);  // both ends of every connection live in this process
  std::vector<int> fds;
  for (int i = 0; i < 1000; ++i) {
    int c = connect_to(f.endpoint->port());
    REQUIRE(c >= 0);
    fds.push_back(c);
  }
  std::string get = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  for (int c : fds)
    ::send(c, get.data(), get.size(), 0);
  std::atomic<int> ok{0}, other{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 8; ++t)
    readers.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < fds.size(); i += 8) {
        auto answer = read_all(fds[i]);
        (answer.rfind("HTTP/1.1 200", 0) == 0 ? ok : other)++;
        ::close(fds[i]);
      }
    });
  for (auto& r : readers)
    r.join();
  CHECK(ok == 1000);
  CHECK(other == 0);

  // 256 clients connecting at the same moment (agents starting together): all
  // answered; a listen backlog of 5 lost some of them.
  std::atomic<int> ready{0}, burst_ok{0};
  std::vector<std::thread> burst;
  for (int t = 0; t < 256; ++t)
    burst.emplace_back([&] {
      ready++;
      while (ready < 256)
        std::this_thread::yield();
      auto c = f.client();
      auto r = c.Get("/health");
      if (r && r->status == 200)
        burst_ok++;
    });
  for (auto& t : burst)
    t.join();
  CHECK(burst_ok == 256);
  // And a model call still works.
  f.post("/v1/chat/completions", chat_body(), 200);
}
