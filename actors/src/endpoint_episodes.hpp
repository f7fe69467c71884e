// The episode routes of the endpoint (POST /rl/episodes, .../reward, .../end):
// what each does with a request body, apart from the HTTP server. Each returns
// the response's JSON or throws openai::api_error. Internal to actors/.
#pragma once

#include <memory>
#include <string>

#include <caf/actor_system.hpp>
#include <nlohmann/json.hpp>

#include "areal/actors/endpoint.hpp"
#include "areal/actors/episode_table.hpp"
#include "endpoint_openai.hpp"

namespace areal {

class episode_routes {
 public:
  /// `episodes` may be empty (no chat template: episodes are refused).
  episode_routes(caf::actor_system& sys, const endpoint_setup& setup, const std::unique_ptr<episode_table>& episodes)
      : sys(sys), setup(setup), episodes(episodes) {}

  /// {"task": KEY, "eval"?: bool}: a new episode, admitted by the controller (or held out).
  nlohmann::json open(const std::string& body);
  /// {"reward": R}
  nlohmann::json reward(const std::string& id, const std::string& body);
  /// {"reward"?: R}: the episode to the sample store (trained), measured (held out) or dropped.
  nlohmann::json end(const std::string& id, const std::string& body);
  /// The controller learns of an episode that will not be trained.
  void tell_dropped(const closed_episode& c) const;

 private:
  caf::actor_system& sys;
  const endpoint_setup& setup;
  const std::unique_ptr<episode_table>& episodes;
};

}  // namespace areal
