// areal-calculator-agent: the built-in multi-turn task of agent runs, an
// environment that talks to areal over HTTP only (the OpenAI chat API and the
// /rl/episodes routes), as any external agent would.
//
// The task: a sum of 3-digit numbers ("417+385+902"), too long for a tiny
// model to add in its head, with a calculator tool `add` that adds the next
// term to its running total and answers the total and how many terms are left
// ("802, 1 left", "1704, done"). The model calls it once per term, then
// replies; the reward is 1 when the sum is complete (every term added), else 0.
//
// Its modes (AREAL_AGENT_MODE, see actors/src/agent_program.hpp):
//   demos  writes AREAL_DEMOS transcripts to stdout; --truncated of them reply
//          one call short, with a term left (mixed quality: RL with the
//          environment's reward teaches the model to finish)
//   eval   runs AREAL_EVAL_EPISODES held-out sums greedily (temperature 0)
//   train  runs episodes, AREAL_GROUP_SIZE per sum, until the run ends
//
//   areal-calculator-agent [--min-terms 2] [--max-terms 4] [--truncated 0.6] [--threads 32] [--show 0]
// (--show N: the first N held-out episodes' transcripts to stderr)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

using json = nlohmann::json;

namespace {

struct options {
  int min_terms = 2, max_terms = 4;
  double truncated = 0.6;
  int threads = 32;
  int max_calls = 8;  // an episode that calls more is ended with reward 0
  int show = 0;       // held-out episodes whose transcript is printed (stderr)
};

struct settings {
  std::string mode, base_url, api_key, model;
  uint64_t seed = 1;
  int64_t group_size = 8, demos = 0, eval_episodes = 0;
};

std::string env(const char* name, const std::string& fallback = {}) {
  auto v = std::getenv(name);
  return v ? std::string{v} : fallback;
}

// The sum of task `index` of a stream: its terms.
std::vector<int> make_task(const options& o, uint64_t seed, uint64_t stream, uint64_t index) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(stream),
                    static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32)};
  std::mt19937_64 rng{seq};
  std::uniform_int_distribution<int> terms(o.min_terms, o.max_terms), value(100, 999);
  std::vector<int> t(static_cast<size_t>(terms(rng)));
  for (auto& x : t)
    x = value(rng);
  return t;
}

std::string prompt_of(const std::vector<int>& terms) {
  std::string s;
  for (auto x : terms)
    s += (s.empty() ? "" : "+") + std::to_string(x);
  return s;
}

const json& add_tool() {
  // Declared briefly: a character-level model pays for every character of context on every call.
  static const json tool = {{"type", "function"},
                            {"function", {{"name", "add"}, {"description", "adds the next term"}}}};
  return tool;
}

// What the tool answers once `added` terms are in the total: the total and
// how many terms are left ("1648, 2 left", "2390, done").
std::string tool_answer(const std::vector<int>& terms, size_t added) {
  int64_t total = 0;
  for (size_t i = 0; i < added && i < terms.size(); ++i)
    total += terms[i];
  auto left = terms.size() - std::min(added, terms.size());
  return std::to_string(total) + (left == 0 ? ", done" : ", " + std::to_string(left) + " left");
}

json call_message(int n) {
  return {{"role", "assistant"},
          {"content", nullptr},
          {"tool_calls",
           {{{"id", "call_" + std::to_string(n)},
             {"type", "function"},
             {"function", {{"name", "add"}, {"arguments", "{}"}}}}}}};
}

// One demonstration: a call per term, then the reply; or (truncated) the reply one call short.
json demonstration(const std::vector<int>& terms, bool truncated, const settings& s) {
  json messages = json::array({{{"role", "user"}, {"content", prompt_of(terms)}}});
  size_t calls = terms.size() - (truncated ? 1 : 0);
  for (size_t i = 1; i <= calls; ++i) {
    messages.push_back(call_message(static_cast<int>(i)));
    messages.push_back(
        {{"role", "tool"}, {"tool_call_id", "call_" + std::to_string(i)}, {"content", tool_answer(terms, i)}});
  }
  messages.push_back({{"role", "assistant"}, {"content", "done"}});
  return {{"model", s.model}, {"messages", messages}, {"tools", json::array({add_tool()})}};
}

// -- HTTP -----------------------------------------------------------------------

struct reply {
  int status = 0;  // 0: no connection
  json body;
};

class areal_client {
 public:
  explicit areal_client(const settings& s) : client_(s.base_url), key_(s.api_key) {
    client_.set_connection_timeout(10);
    client_.set_read_timeout(600);
    client_.set_write_timeout(60);
  }
  reply post(const std::string& path, const json& body, const std::string& episode = {}) {
    httplib::Headers h{{"Authorization", "Bearer " + key_}};
    if (!episode.empty())
      h.emplace("X-Episode-Id", episode);
    auto r = client_.Post(path, h, body.dump(), "application/json");
    if (!r) {
      std::cerr << "calculator agent: POST " << path << ": " << httplib::to_string(r.error()) << "\n";
      return {};
    }
    return {r->status, json::parse(r->body, nullptr, false)};
  }

 private:
  httplib::Client client_;
  std::string key_;
};

enum class outcome { done, gate_closed, run_ended, unreachable };

// One episode: opens it, runs the calls, ends it with the reward.
outcome run_episode(areal_client& http, const settings& s, const options& o, const std::vector<int>& terms,
                    const std::string& task, bool eval, double* reward_out, json* transcript = nullptr) {
  json open_body = {{"task", task}};
  if (eval)
    open_body["eval"] = true;
  auto opened = http.post("/rl/episodes", open_body);
  if (opened.status == 0)
    return outcome::unreachable;
  if (opened.status == 429)
    return outcome::gate_closed;
  if (opened.status != 200) {
    if (opened.status != 503)
      std::cerr << "calculator agent: episode refused (" << opened.status << "): " << opened.body.dump() << "\n";
    return outcome::run_ended;
  }
  auto id = opened.body["id"].get<std::string>();
  json messages = json::array({{{"role", "user"}, {"content", prompt_of(terms)}}});
  double reward = 0;
  size_t added = 0;  // add calls answered
  for (int call = 0; call <= o.max_calls; ++call) {
    json request = {{"model", s.model},
                    {"messages", messages},
                    {"tools", json::array({add_tool()})},
                    {"temperature", eval ? 0.0 : 1.0},
                    {"max_tokens", 96}};
    reply r;
    for (int attempt = 0; attempt < 200; ++attempt) {
      r = http.post("/v1/chat/completions", request, id);
      if (r.status != 429)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (r.status == 0)
      return outcome::unreachable;
    if (r.status != 200 || !r.body.is_object() || !r.body.contains("choices")) {
      std::cerr << "calculator agent: model call failed (" << r.status << "): " << r.body.dump() << "\n";
      break;  // ended with reward 0
    }
    auto& choice = r.body["choices"][0];
    auto& message = choice["message"];
    messages.push_back(message);
    if (choice.value("finish_reason", "") == "length")
      break;
    auto calls = message.value("tool_calls", json::array());
    if (calls.is_array() && !calls.empty()) {
      // Each call answered: the new total and what is left, or an error the model reads.
      for (auto& c : calls) {
        std::string result;
        if (c["function"].value("name", "") != "add")
          result = "error: the only tool is add";
        else if (added == terms.size())
          result = "error: nothing left to add";
        else
          result = tool_answer(terms, ++added);
        messages.push_back({{"role", "tool"}, {"tool_call_id", c.value("id", "")}, {"content", result}});
      }
      continue;
    }
    // The reply ends the episode: the sum is done when every term was added.
    reward = added == terms.size() ? 1.0 : 0.0;
    break;
  }
  auto ended = http.post("/rl/episodes/" + id + "/end", {{"reward", reward}});
  if (ended.status == 0)
    return outcome::unreachable;
  if (ended.status != 200)
    std::cerr << "calculator agent: ending episode " << id << " failed (" << ended.status << "): " << ended.body.dump()
              << "\n";
  if (reward_out)
    *reward_out = reward;
  if (transcript)
    *transcript = messages;
  return outcome::done;
}

int run_demos(const settings& s, const options& o) {
  std::mt19937_64 quality{s.seed * 7919 + 3};
  std::bernoulli_distribution truncated(o.truncated);
  for (int64_t i = 0; i < s.demos; ++i)
    std::cout << demonstration(make_task(o, s.seed, 3, static_cast<uint64_t>(i)), truncated(quality), s).dump()
              << "\n";
  return std::cout ? 0 : 1;
}

int run_eval(const settings& s, const options& o) {
  std::atomic<int64_t> next{0}, succeeded{0}, failed{0};
  std::mutex print;
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t)
    threads.emplace_back([&] {
      areal_client http{s};
      for (int64_t i; (i = next++) < s.eval_episodes;) {
        double reward = 0;
        auto terms = make_task(o, s.seed, 2, static_cast<uint64_t>(i));
        outcome r;
        json transcript;
        while ((r = run_episode(http, s, o, terms, "eval-" + std::to_string(i), true, &reward, &transcript)) ==
               outcome::gate_closed)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (i < o.show) {
          std::lock_guard<std::mutex> lock{print};
          std::cerr << "calculator agent: held-out episode " << i << " (reward " << reward << "): " << transcript.dump()
                    << "\n";
        }
        if (r != outcome::done) {
          std::cerr << "calculator agent: held-out episode " << i << " could not run ("
                    << (r == outcome::unreachable ? "areal unreachable" : "refused") << ")\n";
          failed++;
          return;
        }
        succeeded += reward > 0 ? 1 : 0;
      }
    });
  for (auto& t : threads)
    t.join();
  std::cerr << "calculator agent: " << succeeded.load() << "/" << s.eval_episodes << " held-out sums right\n";
  return failed.load() == 0 ? 0 : 1;
}

int run_train(const settings& s, const options& o) {
  std::atomic<int64_t> next{0}, episodes{0};
  std::atomic<bool> ended{false}, unreachable{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t)
    threads.emplace_back([&] {
      areal_client http{s};
      while (!ended && !unreachable) {
        auto e = next++;
        auto task = static_cast<uint64_t>(e / s.group_size);
        auto terms = make_task(o, s.seed, 1, task);
        outcome r;
        // A closed gate (the staleness bound): the same episode again, waiting
        // 20 ms, doubling up to 320 ms (32 threads polling fast took the cores
        // from the generation they wait for).
        for (int wait_ms = 20; (r = run_episode(http, s, o, terms, "sum-" + std::to_string(task), false, nullptr)) ==
                                   outcome::gate_closed &&
                               !ended;
             wait_ms = std::min(wait_ms * 2, 320))
          std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        if (r == outcome::run_ended)
          ended = true;
        else if (r == outcome::unreachable)
          unreachable = true;
        else if (r == outcome::done)
          episodes++;
      }
    });
  for (auto& t : threads)
    t.join();
  std::cerr << "calculator agent: " << episodes.load() << " training episodes, "
            << (ended ? "the run ended" : "areal unreachable") << "\n";
  return ended ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "calculator agent: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--min-terms")
        o.min_terms = std::stoi(value());
      else if (a == "--max-terms")
        o.max_terms = std::stoi(value());
      else if (a == "--truncated")
        o.truncated = std::stod(value());
      else if (a == "--threads")
        o.threads = std::stoi(value());
      else if (a == "--show")
        o.show = std::stoi(value());
      else
        throw std::invalid_argument("unknown option " + a);
    } catch (const std::exception& e) {
      std::cerr << "calculator agent: " << e.what()
                << "; usage: areal-calculator-agent [--min-terms N] [--max-terms N] [--truncated F] [--threads N] [--show N]\n";
      return 2;
    }
  }
  if (o.min_terms < 2 || o.max_terms < o.min_terms || o.truncated < 0 || o.truncated > 1 || o.threads < 1) {
    std::cerr << "calculator agent: need 2 <= --min-terms <= --max-terms, 0 <= --truncated <= 1, --threads >= 1\n";
    return 2;
  }
  settings s;
  s.mode = env("AREAL_AGENT_MODE");
  s.base_url = env("AREAL_BASE_URL", "http://127.0.0.1:8000");
  s.api_key = env("OPENAI_API_KEY", "none");
  s.model = env("AREAL_MODEL", "areal");
  try {
    s.seed = std::stoull(env("AREAL_SEED", "1"));
    s.group_size = std::max<int64_t>(1, std::stoll(env("AREAL_GROUP_SIZE", "8")));
    s.demos = std::stoll(env("AREAL_DEMOS", "0"));
    s.eval_episodes = std::stoll(env("AREAL_EVAL_EPISODES", "0"));
  } catch (const std::exception&) {
    std::cerr << "calculator agent: AREAL_SEED, AREAL_GROUP_SIZE, AREAL_DEMOS and AREAL_EVAL_EPISODES are integers\n";
    return 2;
  }
  if (s.mode == "demos")
    return run_demos(s, o);
  if (s.mode == "eval")
    return run_eval(s, o);
  if (s.mode == "train")
    return run_train(s, o);
  std::cerr << "calculator agent: AREAL_AGENT_MODE must be demos, eval or train (areal sets it when it starts the "
               "agent: agent.command)\n";
  return 2;
}
