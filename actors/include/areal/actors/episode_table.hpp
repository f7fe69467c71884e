// The episodes of an endpoint (agentic RL): each groups the model calls of
// one agent run and turns them into multi-turn trajectories. CAF free and
// thread safe (the HTTP threads share it), so that it is tested exactly.
//
// Token in, token out: a call whose messages extend the previous call's
// messages (and the reply returned for it) continues from the exact token ids
// the model saw and produced; only the new messages are rendered. The tokens
// the model generated get loss mask 1, everything else (template, tool
// results, user turns) 0. A call whose messages do not extend the previous
// ones (a client that rewrote or edited the history, other tools) starts a new
// trajectory of the same episode: the split is counted, nothing is mis-aligned.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "areal/actors/sample_ledger.hpp"
#include "areal/kernels/chat_template.hpp"
#include "areal/messages/records.hpp"

namespace areal {

/// Why an episode request cannot be served; `status` is the HTTP status it maps to.
struct episode_error : std::runtime_error {
  episode_error(int http_status, const std::string& what) : std::runtime_error(what), status(http_status) {}
  int status;
};

/// What a call generates from.
struct episode_call {
  std::vector<int32_t> context;  // every token the model sees
  bool split = false;            // a new trajectory of the episode started here
  int64_t admitted_version = 0;
};

/// What the model produced for a call.
struct episode_reply {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int64_t> versions;
  finish_reason finish = finish_reason::stop;
  kernels::chat_message message;  // as returned to the client
};

/// An episode that left the table: trained (trajectories, reward set) or dropped (reason).
struct closed_episode {
  std::string id;
  sample_id sample;
  std::vector<trajectory> trajectories;
  std::string drop_reason;  // empty: to be trained
  bool eval = false;        // a held-out episode: its reward is measured, it is not trained
  double reward = 0;
};

struct episode_counts {
  int64_t opened = 0, ended = 0, dropped = 0, calls = 0, splits = 0, open = 0;
  // Held-out episodes (not trained, not in the counts above): ended, dropped, the sum of their rewards.
  int64_t eval_ended = 0, eval_dropped = 0;
  double eval_reward_sum = 0;
};

class episode_table {
 public:
  using clock = std::chrono::steady_clock;
  episode_table(const kernels::chat_template& chat, std::chrono::milliseconds timeout, std::string producer);

  /// A new episode of sample `id` (admitted at `version`); the reply is its id.
  /// `eval`: a held-out episode, measured and never trained (no sample).
  std::string open(sample_id id, int64_t version, clock::time_point now, bool eval = false);
  /// Starts a call of the episode (one at a time): the tokens to generate from.
  /// Throws episode_error: unknown or closed episode (404), a call in flight (409).
  episode_call begin_call(const std::string& id, const std::vector<kernels::chat_message>& messages,
                          const std::vector<std::string>& tools);
  /// The call's output joins the episode (generated tokens: mask 1).
  void finish_call(const std::string& id, const episode_reply& reply);
  /// The call failed (generation error, client gone): the episode is as before it.
  void abort_call(const std::string& id);
  void set_reward(const std::string& id, double reward);
  /// Ends the episode: its trajectories, or why it is dropped (no model call).
  /// Throws episode_error: unknown (404), a call in flight (409), no reward (400).
  closed_episode end(const std::string& id);
  /// Ends the episode without training it (the client abandoned it).
  closed_episode drop(const std::string& id, const std::string& reason);
  /// Episodes past their deadline, dropped.
  std::vector<closed_episode> expire(clock::time_point now);
  /// Every open episode, dropped (the endpoint stops).
  std::vector<closed_episode> drop_all(const std::string& reason);

  /// The sample of an open episode (for the controller's bookkeeping).
  std::optional<sample_id> sample_of(const std::string& id) const;
  episode_counts counts() const;

 private:
  struct segment {
    std::vector<int32_t> prompt;  // the first call's rendered prompt
    std::vector<int32_t> output;  // everything after: generated (mask 1) and rendered (mask 0)
    std::vector<float> logprobs;
    std::vector<int64_t> versions;
    std::vector<uint8_t> mask;
    std::vector<kernels::chat_message> messages;  // the history, with the replies as returned
    std::vector<std::string> tools;
    int64_t generated = 0;
  };
  struct episode {
    sample_id sample;
    bool eval = false;
    int64_t admitted_version = 0;
    clock::time_point deadline;
    std::vector<segment> done;  // trajectories closed by a split
    segment current;
    std::optional<double> reward;
    bool in_call = false;
    size_t rollback = 0;  // output size before the call in flight appended its prompt tokens
    bool split_in_call = false;
    std::vector<kernels::chat_message> messages_before;  // the history before the call in flight
    int64_t last_version = 0;
  };
  episode& find(const std::string& id);
  trajectory to_trajectory(const episode& e, const segment& s) const;
  closed_episode close(std::map<std::string, episode>::iterator it, const std::string& reason);

  const kernels::chat_template& chat_;
  std::chrono::milliseconds timeout_;
  std::string producer_;
  mutable std::mutex mutex_;
  std::map<std::string, episode> open_;
  uint64_t next_ = 0;
  episode_counts counts_;
};

}  // namespace areal
