// Episodes and their token bookkeeping (see episode_table.hpp).
#include "areal/actors/episode_table.hpp"

#include <algorithm>
#include <cstdio>
#include <random>

namespace areal {

episode_table::episode_table(const kernels::chat_template& chat, std::chrono::milliseconds timeout,
                             std::string producer)
    : chat_(chat), timeout_(timeout), producer_(std::move(producer)) {}

std::string episode_table::open(sample_id id, int64_t version, clock::time_point now, bool eval) {
  // Ids are not guessable: a client cannot end or reward another client's episode by counting.
  static thread_local std::mt19937_64 random{std::random_device{}()};
  std::lock_guard<std::mutex> lock{mutex_};
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(random()));
  auto name = "ep-" + std::to_string(next_++) + "-" + suffix;
  episode e;
  e.sample = id;
  e.eval = eval;
  e.admitted_version = version;
  e.last_version = version;
  e.deadline = now + timeout_;
  open_.emplace(name, std::move(e));
  if (!eval)
    counts_.opened++;
  return name;
}

episode_table::episode& episode_table::find(const std::string& id) {
  auto it = open_.find(id);
  if (it == open_.end())
    throw episode_error(404, "no open episode \"" + id +
                                 "\" (it never existed, ended, or passed its deadline); open one with POST /rl/episodes");
  return it->second;
}

namespace {

// `prefix` messages come first in `messages`, each equal.
bool extends(const std::vector<kernels::chat_message>& prefix, const std::vector<kernels::chat_message>& messages) {
  if (prefix.size() >= messages.size())
    return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (!(prefix[i] == messages[i]))
      return false;
  return true;
}

}  // namespace

episode_call episode_table::begin_call(const std::string& id, const std::vector<kernels::chat_message>& messages,
                                       const std::vector<std::string>& tools) {
  std::lock_guard<std::mutex> lock{mutex_};
  auto& e = find(id);
  if (e.in_call)
    throw episode_error(409, "episode " + id + " has a model call in flight; its calls go one at a time");
  auto& s = e.current;
  episode_call call;
  call.admitted_version = e.admitted_version;
  e.split_in_call = false;
  if (s.prompt.empty()) {
    s.prompt = chat_.render(messages, tools, true);
    s.tools = tools;
  } else if (s.tools == tools && extends(s.messages, messages)) {
    // Token in, token out: the episode's own tokens, then the new messages.
    e.rollback = s.output.size();
    std::vector<kernels::chat_message> added(messages.begin() + static_cast<std::ptrdiff_t>(s.messages.size()),
                                             messages.end());
    auto& stops = chat_.stop_tokens();
    bool closed_turn = !s.output.empty() && std::find(stops.begin(), stops.end(), s.output.back()) != stops.end();
    std::vector<int32_t> rendered;
    if (!closed_turn)
      rendered.push_back(stops.front());  // the last reply was cut by its length: its turn is closed here
    auto rest = chat_.render(added, {}, true, true);
    rendered.insert(rendered.end(), rest.begin(), rest.end());
    s.output.insert(s.output.end(), rendered.begin(), rendered.end());
    s.logprobs.insert(s.logprobs.end(), rendered.size(), 0.0f);
    s.versions.insert(s.versions.end(), rendered.size(), e.last_version);
    s.mask.insert(s.mask.end(), rendered.size(), 0);
  } else {
    // The history was rewritten: what the episode holds so far is one trajectory, this call starts the next.
    e.done.push_back(std::move(s));
    s = segment{};
    s.prompt = chat_.render(messages, tools, true);
    s.tools = tools;
    call.split = true;
    e.split_in_call = true;
    counts_.splits++;
  }
  call.context = s.prompt;
  call.context.insert(call.context.end(), s.output.begin(), s.output.end());
  e.messages_before = s.messages;
  s.messages = messages;  // the reply joins them at finish_call
  e.in_call = true;
  return call;
}

void episode_table::finish_call(const std::string& id, const episode_reply& reply) {
  std::lock_guard<std::mutex> lock{mutex_};
  auto it = open_.find(id);
  if (it == open_.end())
    return;  // it passed its deadline meanwhile
  auto& e = it->second;
  auto& s = e.current;
  s.output.insert(s.output.end(), reply.tokens.begin(), reply.tokens.end());
  s.logprobs.insert(s.logprobs.end(), reply.logprobs.begin(), reply.logprobs.end());
  s.versions.insert(s.versions.end(), reply.versions.begin(), reply.versions.end());
  s.mask.insert(s.mask.end(), reply.tokens.size(), 1);
  s.generated += static_cast<int64_t>(reply.tokens.size());
  if (!reply.versions.empty())
    e.last_version = reply.versions.back();
  s.messages.push_back(reply.message);
  e.in_call = false;
  counts_.calls++;
}

void episode_table::abort_call(const std::string& id) {
  std::lock_guard<std::mutex> lock{mutex_};
  auto it = open_.find(id);
  if (it == open_.end() || !it->second.in_call)
    return;
  auto& e = it->second;
  auto& s = e.current;
  if (e.split_in_call) {
    // The new trajectory had nothing yet: the closed one is current again.
    s = std::move(e.done.back());
    e.done.pop_back();
    counts_.splits--;
  } else if (s.generated == 0 && s.output.empty()) {
    s = segment{};  // the first call: nothing was there
  } else {
    s.output.resize(e.rollback);
    s.logprobs.resize(e.rollback);
    s.versions.resize(e.rollback);
    s.mask.resize(e.rollback);
    s.messages = std::move(e.messages_before);
  }
  e.in_call = false;
}

void episode_table::set_reward(const std::string& id, double reward) {
  std::lock_guard<std::mutex> lock{mutex_};
  find(id).reward = reward;
}

trajectory episode_table::to_trajectory(const episode& e, const segment& s) const {
  trajectory t;
  t.prompt_id = e.sample.group;
  t.group_id = e.sample.group;
  t.sample_index = e.sample.index;
  t.prompt_tokens = s.prompt;
  t.output_tokens = s.output;
  t.behaviour_logprobs = s.logprobs;
  t.token_versions = s.versions;
  t.loss_mask = s.mask;
  t.finish = finish_reason::stop;
  t.reward = static_cast<float>(e.reward.value_or(0.0));
  t.judged = t.reward > 0 ? verdict::correct : verdict::wrong;
  t.verdict_detail = "reward set by the agent";
  t.producer = producer_;
  t.prompt_version = e.admitted_version;
  return t;
}

closed_episode episode_table::close(std::map<std::string, episode>::iterator it, const std::string& reason) {
  closed_episode out;
  out.id = it->first;
  out.sample = it->second.sample;
  out.drop_reason = reason;
  if (reason.empty()) {
    auto& e = it->second;
    for (auto& s : e.done)
      if (s.generated > 0)
        out.trajectories.push_back(to_trajectory(e, s));
    if (e.current.generated > 0)
      out.trajectories.push_back(to_trajectory(e, e.current));
    if (out.trajectories.empty())
      out.drop_reason = "the episode made no model call";
  }
  out.eval = it->second.eval;
  out.reward = it->second.reward.value_or(0.0);
  if (out.eval) {
    (out.drop_reason.empty() ? counts_.eval_ended : counts_.eval_dropped)++;
    if (out.drop_reason.empty())
      counts_.eval_reward_sum += out.reward;
  } else {
    (out.drop_reason.empty() ? counts_.ended : counts_.dropped)++;
  }
  open_.erase(it);
  return out;
}

closed_episode episode_table::end(const std::string& id) {
  std::lock_guard<std::mutex> lock{mutex_};
  auto& e = find(id);
  if (e.in_call)
    throw episode_error(409, "episode " + id + " has a model call in flight; end it after the reply");
  if (!e.reward)
    throw episode_error(400, "episode " + id +
                                 " has no reward; POST /rl/episodes/" + id +
                                 "/reward {\"reward\": R} first, or give \"reward\" in this request");
  return close(open_.find(id), {});
}

closed_episode episode_table::drop(const std::string& id, const std::string& reason) {
  std::lock_guard<std::mutex> lock{mutex_};
  find(id);
  return close(open_.find(id), reason);
}

std::vector<closed_episode> episode_table::expire(clock::time_point now) {
  std::lock_guard<std::mutex> lock{mutex_};
  std::vector<closed_episode> out;
  for (auto it = open_.begin(); it != open_.end();) {
    auto next = std::next(it);
    if (it->second.deadline <= now)
      out.push_back(close(it, "the episode was not ended within " + std::to_string(timeout_.count() / 1000) +
                                  " s (endpoint.episode_timeout_s)"));
    it = next;
  }
  return out;
}

std::vector<closed_episode> episode_table::drop_all(const std::string& reason) {
  std::lock_guard<std::mutex> lock{mutex_};
  std::vector<closed_episode> out;
  while (!open_.empty())
    out.push_back(close(open_.begin(), reason));
  return out;
}

std::optional<sample_id> episode_table::sample_of(const std::string& id) const {
  std::lock_guard<std::mutex> lock{mutex_};
  auto it = open_.find(id);
  if (it == open_.end())
    return std::nullopt;
  return it->second.sample;
}

episode_counts episode_table::counts() const {
  std::lock_guard<std::mutex> lock{mutex_};
  auto c = counts_;
  c.open = static_cast<int64_t>(open_.size());
  return c;
}

}  // namespace areal
