// The OpenAI-compatible HTTP endpoint of a rollout node (cpp-httplib):
//   GET  /v1/models, /v1/models/{id}
//   POST /v1/chat/completions   (tools, stream with server-sent events, logprobs, n, stop, seed)
//   POST /v1/completions
//   POST /rl/episodes                 {"task": KEY} -> {"id": ...}   (agent runs)
//   POST /rl/episodes/{id}/reward     {"reward": R}
//   POST /rl/episodes/{id}/end        {"reward": R}? -> the episode is trained
//   GET  /health
// A model call names its episode with the header "X-Episode-Id: ID" (or the
// request's "user" field set to the id). Every call goes through the node's
// rollout workers: the same engines, continuous batching and weight updates
// as built-in samples; each generated token keeps its log-probability and
// policy version, and the response carries the exact token ids
// ("token_ids", "token_versions" per choice). Errors are OpenAI error objects
// (400 bad request, 401 key, 404, 409 episode busy, 413 body too large, 429
// full or gate closed, 503 deadline or run ended).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "areal/actors/episode_table.hpp"
#include "areal/actors/interfaces.hpp"
#include "areal/kernels/chat_template.hpp"
#include "areal/kernels/tokenizer.hpp"

namespace areal {

struct endpoint_setup {
  std::string host = "127.0.0.1";
  uint16_t port = 0;    // 0: a free port (see http_endpoint::port)
  std::string api_key;  // empty: none (loopback only; the configuration checks say so)
  std::string model_name = "areal";
  size_t max_body_bytes = size_t{1} << 20;
  std::chrono::milliseconds request_timeout{120000};
  int64_t max_pending = 256;  // model calls generating or waiting at once
  int64_t threads = 64;       // connections served at once
  std::chrono::milliseconds episode_timeout{600000};
  int64_t default_max_tokens = 256;  // a chat call without max_tokens (cut to the context)
  int64_t max_seq_len = 1024;        // prompt + generated tokens
  uint64_t seed = 1;                 // calls without a seed draw theirs from this
  std::vector<rollout_actor> rollouts;
  controller_actor controller;  // episodes (agent runs); optional
  sample_store_actor store;     // where ended episodes go
  std::shared_ptr<const kernels::tokenizer> tokenizer;
  std::shared_ptr<const kernels::chat_template> chat;  // null: chat calls are refused with `no_chat_reason`
  std::string no_chat_reason;
  int32_t eos = 0;  // stop token of plain completions
  std::string name = "endpoint";
};

struct endpoint_counts {
  int64_t requests = 0;
  int64_t completed = 0;     // model calls answered with output
  int64_t client_errors = 0; // 4xx
  int64_t server_errors = 0; // 5xx
  int64_t busy = 0;          // 429 for a full queue
  int64_t cancelled = 0;     // generations stopped because the client went away or the deadline passed
  int64_t tokens = 0;        // generated
  episode_counts episodes;
};

class http_endpoint {
 public:
  /// Binds and starts serving; throws std::runtime_error saying why it cannot.
  http_endpoint(caf::actor_system& sys, endpoint_setup setup);
  ~http_endpoint();
  http_endpoint(const http_endpoint&) = delete;
  http_endpoint& operator=(const http_endpoint&) = delete;

  uint16_t port() const;
  /// Stops serving: open episodes are dropped (the controller is told), calls in flight end.
  void stop();
  endpoint_counts counts() const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace areal
