// Model calls of the endpoint: one generation request per choice to a rollout
// worker, through a relay actor that hands the streamed tokens and the reply
// to the HTTP thread waiting for them. Internal to actors/.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"
#include "endpoint_openai.hpp"

namespace areal::endpoint_detail {

struct call_plan {
  std::vector<int32_t> prompt;
  openai::generation_ask ask;
  std::vector<int32_t> stop_tokens;
  uint32_t max_new_tokens = 0;
  uint64_t seed = 0;
  int64_t admitted_version = 0;
};

/// Told the tokens of a choice as they are sampled; false when the client is
/// gone (the generation is then cancelled).
using delta_sink = std::function<bool(size_t choice, const std::vector<int32_t>& tokens)>;

/// Why a call produced no output: the HTTP status and message.
struct call_failed {
  int status;
  std::string message;
};

/// Runs the plan's n choices on the workers (from `first_worker` on, round
/// robin); throws call_failed (deadline: 503 and the generations stopped;
/// client gone: 499; a worker's error: 503).
std::vector<openai::choice> run_call(caf::actor_system& sys, const std::vector<rollout_actor>& workers,
                                     size_t first_worker, const call_plan& plan,
                                     std::chrono::milliseconds timeout, const delta_sink& on_delta);

}  // namespace areal::endpoint_detail
