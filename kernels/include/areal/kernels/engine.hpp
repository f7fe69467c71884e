// The generation engine of a rollout worker: continuous batching over a fixed
// number of slots with a preallocated KV cache, chunked prefill of new
// requests while others decode, per-request sampling with its own seed, and
// interruptible weight updates.
//
// One call of step() is one forward pass over: one token of every decoding
// sequence, plus up to prefill_chunk prompt tokens of sequences still being
// prefilled (oldest first); members of a group whose prompt the pool holds
// take their first token from its kept logits in the same step, without a row
// (a step with nothing else to compute runs no forward pass). Sequences that
// finish leave at once and their slot is refilled from the queue at the next
// step; the last occupied slot moves into the hole so that decoding slots stay
// packed at the front of the cache.
//
// update_weights(version, weights) takes effect at the next step boundary,
// in one of three ways (interruption_mode):
//   reprefill (the default, the paper's): every in-flight sequence drops its
//     cache and is re-prefilled (prompt + tokens so far) with the new weights;
//   keep_cache: the weights change under the in-flight sequences, whose caches
//     keep the keys and values the old weights computed. No re-prefill; the
//     price is exactness: later tokens attend to a context encoded by the old
//     policy, so their behaviour log-probabilities are those of neither policy
//     alone (the version each token records is still exact: the one that
//     sampled it);
//   wait (the ablation): no new sequences start until the in-flight ones finish
//     with the old weights; then the swap.
// In the first two, tokens sampled after the swap carry the new version.
//
// Shared prompts (prompt_pool_tokens > 0): the n samples of a group have the
// same prompt. The first of them to start creates a pool entry for the whole
// prompt, prefilled once into the cache's prompt pool, which keeps the logits of
// the prompt's last row: every member samples its first token from them (with
// its own generator), reads the prompt's keys and values from the pool and keeps
// only its own tokens in its slot: no copy and no row of the shared part per
// member. A member that arrives after the first one already prefilled the
// prompt in its own slot makes the entry from those rows (one copy, no compute;
// no logits, so each member computes the prompt's last row itself). A prompt that extends an entry already
// in the pool (the next turn of a conversation) gets a new entry whose first rows are copied from the old one and only
// the rest computed. Entries outlive their users until the pool needs the room (least recently used first) or the
// weights change; after a re-prefill the members share the recomputation too.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "areal/kernels/model.hpp"
#include "areal/kernels/sampling.hpp"
#include "areal/messages/records.hpp"

namespace areal::kernels {

enum class interruption_mode { reprefill, keep_cache, wait };

/// "reprefill", "keep_cache" or "wait" (rl.interruption); throws std::invalid_argument otherwise.
interruption_mode parse_interruption(const std::string& name);

struct engine_config {
  int64_t slots = 64;           // sequences decoded together
  int64_t max_seq_len = 1024;   // prompt + generated tokens of one sequence
  int64_t prefill_chunk = 256;  // prompt tokens prefilled per step, over all sequences
  interruption_mode interruption = interruption_mode::reprefill;
  int64_t prompt_pool_tokens = 0;  // KV rows for shared prompts (0: every sequence prefills its own)
  int64_t min_shared_prompt = 4;   // shorter common prompts are prefilled by each sequence
  bool cuda_graphs = true;         // on a CUDA device, steady decode steps replay captured graphs (decode_graphs.hpp)
};

struct generation_job {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  sampling_params sampling;
  uint64_t seed = 0;
  // A generation a checkpoint saved (unfinished): the sequence starts with these
  // tokens (their log-probabilities and versions kept), re-prefilled with the
  // current weights, its generator advanced past the draws that sampled them,
  // so that it goes on as it would have.
  output_so_far so_far;
};

struct generation_output {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;    // log_softmax(logits / temperature)[token], as the trainer computes it
  std::vector<int64_t> versions;  // policy version that sampled each token
  finish_reason finish = finish_reason::unfinished;
};

/// Samples from logits [vocab] with temperature, top-k, top-p or greedy.
sampled_token sample_token(const at::Tensor& logits, const sampling_params& params, at::Generator& generator);

struct engine_counters {
  uint64_t steps = 0;
  uint64_t decode_tokens = 0;         // tokens sampled
  uint64_t prefill_tokens = 0;        // prompt tokens processed the first time
  uint64_t reprefill_tokens = 0;      // tokens processed again after an interruption
  uint64_t shared_prompt_tokens = 0;  // prompt tokens sequences read from the pool instead of prefilling
  uint64_t pool_copied_tokens = 0;    // pool rows copied from an entry a prompt extends (not recomputed)
  uint64_t pool_first_tokens = 0;     // first tokens sampled from logits a pool entry kept (no row computed)
  uint64_t interruptions = 0;
  // What the forward passes computed, as a cost model counts it (a replay of a
  // run fits its step costs to these): sequences that fed one token, the
  // context those tokens attended over, and the positions that prompt and
  // re-prefill tokens attended over.
  uint64_t decode_rows = 0;
  uint64_t decode_context_tokens = 0;
  uint64_t prefill_attended_tokens = 0;
  double forward_seconds = 0;
  double weight_apply_seconds = 0;  // copying new weights into the model
  uint64_t weight_updates = 0;
  uint64_t graph_replays = 0;   // decode steps run as a replayed CUDA graph
  uint64_t graph_captures = 0;  // graphs captured (one per batch and key-count bucket met)
};

class generation_engine {
 public:
  generation_engine(policy_model& model, engine_config config, int64_t version = 0);

  /// Queues a request. Throws std::invalid_argument when it cannot fit
  /// (empty prompt, prompt + max_new_tokens above max_seq_len) or its output so
  /// far cannot be continued (finished, inconsistent, as long as max_new_tokens).
  void submit(generation_job job);
  /// One forward pass; returns the sequences that finished in it.
  std::vector<generation_output> step();
  /// Runs steps until every submitted request finished.
  std::vector<generation_output> run_to_completion();
  /// New weights (a flat buffer of the model's layout), applied at the next step boundary.
  void update_weights(int64_t version, at::Tensor weights);
  /// Ends every queued and running request now, with finish reason `aborted`.
  std::vector<generation_output> abort_all();
  /// Ends one request now (a client that went away), freeing its slot; its
  /// output so far with finish reason `aborted`, or nothing when it is not here.
  std::optional<generation_output> cancel(uint64_t id);
  /// The tokens a running request has so far (nullptr when queued or unknown).
  const generation_output* running_output(uint64_t id) const;

  size_t running() const { return active_.size(); }
  size_t queued() const { return queue_.size(); }
  bool idle() const { return active_.empty() && queue_.empty(); }
  int64_t version() const { return version_; }
  /// The version the next sampled token carries: that of weights waiting for the next step, if any.
  int64_t next_version() const { return pending_update_ ? pending_update_->first : version_; }
  const engine_counters& counters() const { return counters_; }
  const engine_config& config() const { return config_; }
  /// Copies of the running sequences' outputs so far (slot order).
  std::vector<generation_output> in_flight() const;
  /// The KV cache (slot i holds running sequence i), for tests and diagnostics.
  const kv_cache& cache() const { return cache_; }

 private:
  struct sequence {
    generation_job job;
    generation_output out;
    int64_t fed = 0;  // tokens of prompt + output already in the cache (a shared prefix included)
    bool reprefill = false;
    uint64_t prefix = 0;         // the pool entry it reads its prompt from (0: none)
    uint64_t cache_weights = 0;  // weight generation its cached rows were computed with
    at::Generator generator;
    int64_t total() const { return static_cast<int64_t>(job.prompt.size() + out.tokens.size()); }
    int32_t token_at(int64_t i) const;
  };
  // A prompt shared through the cache's pool: tokens [0, tokens.size()) of
  // every user's context live in pool rows [at, at + tokens.size()).
  struct prompt_prefix {
    std::vector<int32_t> tokens;
    int64_t at = 0;
    int64_t filled = 0;          // rows computed so far
    uint64_t weights = 0;        // weight generation that computed them
    int64_t users = 0;           // sequences reading it
    uint64_t last_used = 0;      // step of the last attach: eviction order
    bool for_reprefill = false;  // computed again after an interruption
    // The last row's logits [vocab], kept when a step computed that row (not
    // when the rows were copied). Members attached before it is filled sample
    // in that step; later ones attach only under the same weights: the
    // version their first token records is the one that computed the logits.
    at::Tensor logits;
    int64_t size() const { return static_cast<int64_t>(tokens.size()); }
    bool ready() const { return filled == size(); }
    /// Whether a member can take its first token from here (now or once filled).
    bool gives_logits() const { return logits.defined() || !ready(); }
  };
  void apply_pending_update();
  void admit();
  /// Points a sequence that starts (or restarts) at a pool entry for its prompt, when sharing pays.
  void attach_prefix(size_t slot);
  void release_prefix(sequence& s);
  /// First pool row of a free range of `rows`, evicting unused entries; -1 when none.
  int64_t allocate_pool(int64_t rows);
  bool has_sibling(size_t slot) const;
  /// Frees `slot`: the last active sequence (and its cache rows) moves into it.
  void remove_slot(size_t slot);

  policy_model& model_;
  engine_config config_;
  kv_cache cache_;
  std::vector<sequence> active_;  // active_[i] occupies cache slot i
  std::deque<generation_job> queue_;
  int64_t version_;
  std::optional<std::pair<int64_t, at::Tensor>> pending_update_;
  std::map<uint64_t, prompt_prefix> prefixes_;  // by id, in creation order
  uint64_t next_prefix_id_ = 1;
  uint64_t weight_generation_ = 0;  // bumped by every applied update
  engine_counters counters_;
};

}  // namespace areal::kernels
