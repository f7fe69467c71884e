// The work of the endpoint's episode routes (see endpoint_episodes.hpp).
#include "endpoint_episodes.hpp"

#include <chrono>
#include <cmath>
#include <optional>

#include <caf/all.hpp>

#include "areal/runtime/log.hpp"

namespace areal {

using nlohmann::json;
using openai::api_error;

namespace {

// The body of an episode route: empty (no fields) or a JSON object.
json body_object(const std::string& body) {
  if (body.empty())
    return json::object();
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw api_error{400, "the request body must be a JSON object"};
  return j;
}

}  // namespace

json episode_routes::open(const std::string& body) {
  auto j = body_object(body);
  for (auto& [key, v] : j.items())
    if (key != "task" && key != "eval")
      throw api_error{400, "unknown field \"" + key + "\" (POST /rl/episodes reads: task, eval)", key};
  if (j.contains("eval") && !j["eval"].is_boolean())
    throw api_error{400, "eval must be true (a held-out episode: measured, not trained) or false", "eval"};
  bool eval = j.value("eval", false);
  if (!j.contains("task") || !j["task"].is_string() || j["task"].get<std::string>().empty())
    throw api_error{400,
                    "name the episode's task: {\"task\": \"KEY\"}; the episodes of one task form a group "
                    "(their rewards are compared)",
                    "task"};
  if (!episodes)
    throw api_error{400, "episodes are chats, and this model has no chat template: " + setup.no_chat_reason};
  auto task = j["task"].get<std::string>();
  if (eval) {
    // Held out: no admission, no sample; only its reward is counted.
    auto id = episodes->open({}, 0, episode_table::clock::now(), true);
    return json{{"id", id}, {"task", task}, {"eval", true}};
  }
  if (!setup.controller)
    throw api_error{400, "this endpoint serves model calls only; episodes are trained in RL runs"};
  caf::scoped_actor self{sys};
  std::optional<api_error> failed;
  uint64_t group = 0;
  uint32_t index = 0;
  int64_t version = 0;
  self->request(setup.controller, std::chrono::seconds(30), episode_atom::value, task, setup.name)
      .receive([&](uint64_t g, uint32_t i, int64_t v) { group = g, index = i, version = v; },
               [&](caf::error& err) {
                 bool gate = err.category() == caf::atom("episode") &&
                             err.code() == static_cast<uint8_t>(episode_errc::gate_closed);
                 bool not_agent = err.category() == caf::atom("episode") &&
                                  err.code() == static_cast<uint8_t>(episode_errc::not_agent_run);
                 failed = api_error{gate ? 429 : not_agent ? 400 : 503, "episode refused: " + describe(err)};
               });
  if (failed)
    throw *failed;
  auto id = episodes->open({group, index}, version, episode_table::clock::now());
  return json{{"id", id}, {"task", task}, {"group", group}, {"index", index}, {"version", version}};
}

json episode_routes::reward(const std::string& id, const std::string& body) {
  if (!episodes)
    throw api_error{404, "no open episode \"" + id + "\""};
  auto j = body_object(body);
  if (!j.contains("reward") || !j["reward"].is_number())
    throw api_error{400, "give the episode's reward as a number: {\"reward\": 1.0}", "reward"};
  auto reward = j["reward"].get<double>();
  if (!std::isfinite(reward))
    throw api_error{400, "the reward must be finite", "reward"};
  try {
    episodes->set_reward(id, reward);
  } catch (const episode_error& e) {
    throw api_error{e.status, e.what()};
  }
  return json{{"id", id}, {"reward", reward}};
}

void episode_routes::tell_dropped(const closed_episode& c) const {
  if (setup.controller && !c.eval)
    caf::anon_send(setup.controller, episode_atom::value, c.sample.group, c.sample.index, c.drop_reason);
}

json episode_routes::end(const std::string& id, const std::string& body) {
  if (!episodes)
    throw api_error{404, "no open episode \"" + id + "\""};
  auto j = body_object(body);
  if (j.contains("reward"))
    reward(id, body);
  closed_episode c;
  try {
    c = episodes->end(id);
  } catch (const episode_error& e) {
    throw api_error{e.status, e.what()};
  }
  if (!c.drop_reason.empty()) {
    tell_dropped(c);
    return json{{"id", id}, {"status", "dropped"}, {"reason", c.drop_reason}};
  }
  if (c.eval)
    return json{{"id", id}, {"status", "measured"}, {"eval", true}, {"reward", c.reward}};
  std::vector<packed<trajectory>> parts;
  int64_t tokens = 0, generated = 0;
  for (auto& t : c.trajectories) {
    tokens += static_cast<int64_t>(t.prompt_tokens.size() + t.output_tokens.size());
    generated += t.generated_tokens();
    parts.push_back(*pack(t));
  }
  caf::scoped_actor self{sys};
  std::string failed;
  self->request(setup.store, std::chrono::seconds(30), std::move(parts))
      .receive([&](sample_summary& s) { caf::anon_send(setup.controller, episode_atom::value, std::move(s)); },
               [&](caf::error& err) { failed = describe(err); });
  if (!failed.empty()) {
    c.drop_reason = "the sample store did not take it: " + failed;
    tell_dropped(c);
    throw api_error{503, "episode " + id + " could not be stored (" + failed + "); it is dropped"};
  }
  return json{{"id", id},
              {"status", "ended"},
              {"trajectories", c.trajectories.size()},
              {"tokens", tokens},
              {"generated_tokens", generated}};
}

}  // namespace areal
