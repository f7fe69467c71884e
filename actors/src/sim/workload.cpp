// Per-sample draws of a simulated workload (workload.hpp).
#include "areal/sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace areal::sim {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform in (0, 1) for one purpose of one sample.
double uniform(uint64_t seed, uint64_t group, uint32_t index, uint64_t purpose) {
  uint64_t h = mix(mix(mix(seed) ^ group) ^ (uint64_t(index) << 8 | purpose));
  return (double(h >> 11) + 0.5) / 9007199254740992.0;
}

// A standard normal (Box-Muller over two uniforms of the sample).
double normal(uint64_t seed, uint64_t group, uint32_t index, uint64_t purpose) {
  double u1 = uniform(seed, group, index, purpose), u2 = uniform(seed, group, index, purpose + 1);
  return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace

int64_t workload::response_tokens(uint64_t group, uint32_t index) const {
  double n;
  if (!length_table.empty()) {
    auto i = static_cast<size_t>(uniform(seed, group, index, 1) * double(length_table.size()));
    n = double(length_table[std::min(i, length_table.size() - 1)]);
  } else {
    n = length_median * std::exp(length_sigma * normal(seed, group, index, 2));
  }
  return std::clamp<int64_t>(std::llround(n), 1, max_new_tokens);
}

double workload::reward_seconds(uint64_t group, uint32_t index) const {
  return reward_median_s * std::exp(reward_sigma * normal(seed, group, index, 4));
}

double workload::mean_response_tokens() const {
  double sum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i)
    sum += double(response_tokens(uint64_t(i) + (1ULL << 40), 0));
  return sum / n;
}

std::vector<int64_t> read_length_table(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error(path + ": cannot open the length table");
  std::vector<int64_t> out;
  std::string line;
  bool jsonl = path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  for (int number = 1; std::getline(in, line); ++number) {
    if (jsonl) {
      // A run's trajectories.jsonl (rl.record_trajectories): the length of each "output_tokens".
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("output_tokens") || !j["output_tokens"].is_array())
        throw std::runtime_error(path + ":" + std::to_string(number) +
                                 ": expected a JSON object with an \"output_tokens\" array (a trajectories.jsonl line)");
      if (!j["output_tokens"].empty())
        out.push_back(static_cast<int64_t>(j["output_tokens"].size()));
      continue;
    }
    if (auto hash = line.find('#'); hash != std::string::npos)
      line.resize(hash);
    std::istringstream fields(line);
    int64_t length = 0, count = 1;
    if (!(fields >> length)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos)
        continue;
      throw std::runtime_error(path + ":" + std::to_string(number) + ": expected LENGTH or LENGTH COUNT, got \"" +
                               line + "\"");
    }
    if (!(fields >> count))
      count = 1;
    if (length < 1 || count < 1 || count > 10000000)
      throw std::runtime_error(path + ":" + std::to_string(number) +
                               ": a length must be at least 1 and a count between 1 and 10,000,000");
    out.insert(out.end(), static_cast<size_t>(count), length);
  }
  if (out.empty())
    throw std::runtime_error(path + ": the length table holds no lengths");
  return out;
}

}  // namespace areal::sim
