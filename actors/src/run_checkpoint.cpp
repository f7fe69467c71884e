// The controller's checkpoint record (see run_checkpoint.hpp).
#include "areal/actors/run_checkpoint.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace areal {

void controller_checkpoint::set_stream(const stream_position& p) {
  source_position = p.source_position;
  requeue = p.requeue;
  dropped_positions = p.dropped_positions;
  next_group = p.next_group;
}

std::string controller_checkpoint::to_json() const {
  nlohmann::json j = {{"format", 1},
                      {"version", version},
                      {"steps", steps},
                      {"admitted", admitted},
                      {"trained", trained},
                      {"dropped", dropped},
                      {"drop_reasons", drop_reasons},
                      {"max_staleness", max_staleness},
                      {"reward_mean_first", reward_mean_first},
                      {"reward_mean_last", reward_mean_last},
                      {"source_position", source_position},
                      {"requeue", requeue},
                      {"dropped_positions", dropped_positions},
                      {"next_group", next_group},
                      {"generated_tokens", generated_tokens},
                      {"trained_tokens", trained_tokens},
                      {"elapsed_s", elapsed_s}};
  return j.dump(2) + "\n";
}

controller_checkpoint controller_checkpoint::from_json(const std::string& text, const std::string& where) {
  try {
    auto j = nlohmann::json::parse(text);
    if (j.value("format", 0) != 1)
      throw std::invalid_argument(where + ": not a controller checkpoint of format 1");
    controller_checkpoint c;
    c.version = j.at("version").get<int64_t>();
    c.steps = j.at("steps").get<int64_t>();
    c.admitted = j.at("admitted").get<int64_t>();
    c.trained = j.at("trained").get<int64_t>();
    c.dropped = j.at("dropped").get<int64_t>();
    c.drop_reasons = j.at("drop_reasons").get<std::map<std::string, int64_t>>();
    c.max_staleness = j.at("max_staleness").get<int64_t>();
    c.reward_mean_first = j.at("reward_mean_first").get<double>();
    c.reward_mean_last = j.at("reward_mean_last").get<double>();
    c.source_position = j.at("source_position").get<uint64_t>();
    c.requeue = j.at("requeue").get<std::vector<uint64_t>>();
    c.dropped_positions = j.at("dropped_positions").get<std::vector<uint64_t>>();
    c.next_group = j.at("next_group").get<uint64_t>();
    c.generated_tokens = j.at("generated_tokens").get<int64_t>();
    c.trained_tokens = j.at("trained_tokens").get<int64_t>();
    c.elapsed_s = j.at("elapsed_s").get<double>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(where + ": " + e.what());
  }
}

controller_checkpoint controller_checkpoint::load(const std::string& checkpoint_directory) {
  auto path = checkpoint_directory + "/" + file_name;
  std::ifstream in(path);
  if (!in)
    throw std::invalid_argument(path + ": cannot read the controller's checkpoint");
  std::stringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path);
}

}  // namespace areal
