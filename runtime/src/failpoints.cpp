// Failpoints (failpoints.hpp): a small table of probabilities, read once from
// the environment, drawn from under a mutex once any is on (only chaos runs turn them on).
#include "areal/runtime/failpoints.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "areal/runtime/log.hpp"

namespace areal::failpoints {

namespace {

struct table {
  std::mutex m;
  std::map<std::string, double, std::less<>> on;
  std::mt19937_64 draws{0};
  std::atomic<bool> any{false};  // read without the lock: the code paths pass here on every verification
};

table& the_table() {
  static table t;
  return t;
}

bool is_known(std::string_view name) {
  for (auto& k : known)
    if (k == name)
      return true;
  return false;
}

std::string known_names() {
  std::string out;
  for (auto& k : known)
    out += (out.empty() ? "" : ", ") + std::string{k};
  return out;
}

}  // namespace

std::string configure(const std::string& spec, unsigned long long seed) {
  std::map<std::string, double, std::less<>> on;
  std::istringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.find_first_not_of(' ') == std::string::npos)
      continue;
    auto eq = item.find('=');
    auto name = item.substr(0, eq);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!is_known(name))
      return "AREAL_FAILPOINTS: unknown failpoint \"" + name + "\" (known: " + known_names() + ")";
    if (eq == std::string::npos)
      return "AREAL_FAILPOINTS: \"" + name + "\" has no probability; write " + name + "=P with P in [0, 1]";
    auto text = item.substr(eq + 1);
    char* end = nullptr;
    double p = std::strtod(text.c_str(), &end);
    while (end && *end == ' ')
      ++end;
    if (text.empty() || !end || *end != '\0' || !(p >= 0.0 && p <= 1.0))
      return "AREAL_FAILPOINTS: \"" + name + "=" + text + "\": the probability must be a number in [0, 1]";
    on[name] = p;
  }
  auto& t = the_table();
  std::lock_guard<std::mutex> lock{t.m};
  t.on = std::move(on);
  t.any.store(!t.on.empty());
  t.draws.seed(seed);
  return {};
}

std::string configure_from_environment() {
  const char* spec = std::getenv("AREAL_FAILPOINTS");
  if (!spec)
    return {};
  unsigned long long seed = 0;
  if (const char* s = std::getenv("AREAL_FAILPOINTS_SEED"))
    seed = std::strtoull(s, nullptr, 10);
  return configure(spec, seed * 1000003ULL + static_cast<unsigned long long>(getpid()));
}

std::string describe_active() {
  auto& t = the_table();
  std::lock_guard<std::mutex> lock{t.m};
  std::string out;
  for (auto& [name, p] : t.on) {
    std::ostringstream one;
    one << name << "=" << p;
    out += (out.empty() ? "" : ", ") + one.str();
  }
  return out;
}

bool fire(std::string_view name) {
  auto& t = the_table();
  if (!t.any.load(std::memory_order_relaxed))
    return false;
  std::lock_guard<std::mutex> lock{t.m};
  auto it = t.on.find(name);
  if (it == t.on.end())
    return false;
  if (std::uniform_real_distribution<double>{0.0, 1.0}(t.draws) >= it->second)
    return false;
  spdlog::warn("failpoint {} fired", name);
  return true;
}

}  // namespace areal::failpoints
