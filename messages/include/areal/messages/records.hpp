// Plain C++ forms of the records in messages/*.capnp. Actors and kernels work
// with these; codec.hpp turns them into the Cap'n Proto bytes that travel.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace areal {

/// Version of the schemas in messages/*.capnp (mirrors `schemaVersion` there).
inline constexpr uint32_t schema_version = 1;

struct sampling_params {
  float temperature = 1.0f;
  uint32_t top_k = 0;  // 0: off
  float top_p = 1.0f;  // 1: off
  bool greedy = false;
  uint32_t max_new_tokens = 256;
  std::vector<int32_t> stop_tokens;
  bool operator==(const sampling_params&) const;
};

enum class finish_reason : uint8_t { unfinished, stop, length, aborted };

/// What a sample had generated when a checkpoint saved it (messages/generation.capnp).
struct output_so_far {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;    // one per token, as the engine computed them
  std::vector<int64_t> versions;  // the policy version that sampled each token
  finish_reason finish = finish_reason::unfinished;  // stop or length: generated, only its scoring is left
  bool operator==(const output_so_far&) const;
};

struct generation_request {
  uint64_t prompt_id = 0;
  uint64_t group_id = 0;
  uint32_t sample_index = 0;
  std::vector<int32_t> prompt_tokens;
  sampling_params sampling;
  uint64_t seed = 0;
  int64_t admitted_version = 0;
  // A resumed run continues the sample from here (empty: from the prompt).
  output_so_far so_far;
  bool operator==(const generation_request&) const;
};
enum class verdict : uint8_t { unscored, correct, wrong, no_answer, timeout, error, sandbox_violation };

const char* to_string(finish_reason x);
const char* to_string(verdict x);

struct trajectory_timestamps {
  int64_t admitted_ns = 0;
  int64_t generation_start_ns = 0;
  int64_t generation_end_ns = 0;
  int64_t scored_ns = 0;
  int64_t scoring_start_ns = 0;
  bool operator==(const trajectory_timestamps&) const;
};

struct trajectory {
  uint64_t prompt_id = 0;
  uint64_t group_id = 0;
  uint32_t sample_index = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> output_tokens;
  // One entry per output token (the codec rejects records where they differ).
  std::vector<float> behaviour_logprobs;
  std::vector<int64_t> token_versions;
  finish_reason finish = finish_reason::unfinished;
  float reward = 0.0f;
  verdict judged = verdict::unscored;
  std::string verdict_detail;
  trajectory_timestamps timestamps;
  std::string producer;
  // The version of every prompt token: the policy version when the sample was
  // admitted (its prompt was read then), ARCHITECTURE.md section 2.
  int64_t prompt_version = 0;
  // Empty, or one entry per output token: 1 where the model generated the
  // token (trained), 0 for template, tool and environment tokens of a
  // multi-turn episode (context only; their log-probabilities are 0).
  std::vector<uint8_t> loss_mask;
  /// Output tokens the model generated (all of them without a mask).
  int64_t generated_tokens() const;
  bool operator==(const trajectory&) const;
};

enum class dtype : uint8_t { f32, bf16, f16, i64, i32, u8 };
const char* to_string(dtype x);
size_t element_size(dtype x);

struct tensor_entry {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // bytes into the weight buffer
  uint64_t byte_size() const;
  bool operator==(const tensor_entry&) const;
};

struct weight_manifest {
  int64_t version = 0;
  std::vector<tensor_entry> tensors;
  uint64_t total_bytes = 0;
  uint64_t checksum = 0;     // XXH64, seed 0, of the whole buffer; 0: not computed
  uint64_t chunk_bytes = 0;  // transfer chunk size (the last chunk may be shorter); 0: one chunk
  /// Chunks the buffer travels in: ceil(total_bytes / chunk_bytes).
  uint64_t chunk_count() const;
  bool operator==(const weight_manifest&) const;
};

enum class task_kind : uint8_t { math, countdown, code };
const char* to_string(task_kind x);

struct io_case_record {
  std::string input;
  std::string expected_output;
  bool operator==(const io_case_record&) const;
};

/// A task a response is scored against (messages/reward.capnp).
struct reward_task {
  task_kind kind = task_kind::math;
  std::vector<std::string> references;    // math
  bool last_number_answer = false;        // math: the response's last number is its answer (running sums)
  std::vector<int64_t> numbers;           // countdown
  int64_t target = 0;                     // countdown
  std::vector<io_case_record> io_cases;   // code
  std::vector<std::string> assertions;    // code
  std::string test_setup;                 // code: trusted code run before the assertions
  std::vector<std::string> entry_points;  // code: the program's names the assertions use
  float case_time_s = 5.0f;
  float total_time_s = 20.0f;
  bool partial_credit = false;
  bool operator==(const reward_task&) const;
};

struct node_hello {
  uint32_t protocol_version = 0;
  std::string app_id;
  std::string node_name;
  std::vector<std::string> roles;
  std::string host;
  uint16_t port = 0;
  uint32_t pid = 0;
  std::string hostname;
  std::string build;
  int64_t wall_clock_ns = 0;
  bool operator==(const node_hello&) const;
};

/// A sample of a started group, not trained, saved in a run checkpoint with the
/// work done on it: generating (one trajectory, finish unfinished: the tokens so
/// far), generated (one, not scored yet) or scored (as the sample store holds it).
struct saved_sample {
  std::vector<trajectory> segments;
  bool scored = false;
  bool operator==(const saved_sample&) const;
};

/// The controller's state in a run checkpoint (messages/run_state.capnp).
struct run_state {
  int64_t version = 0;
  int64_t steps = 0;
  int64_t admitted = 0;  // = trained + dropped: unfinished work is re-queued, not counted
  int64_t trained = 0;
  int64_t dropped = 0;
  std::map<std::string, int64_t> drop_reasons;
  int64_t max_staleness = 0;
  double reward_mean_first = 0;
  double reward_mean_last = 0;
  uint64_t source_position = 0;             // prompts taken from the stream
  std::vector<uint64_t> requeue;            // stream positions of groups started but not trained
  std::vector<uint64_t> dropped_positions;  // stream positions of the groups dropped (with a reason)
  uint64_t next_group = 0;
  int64_t generated_tokens = 0;
  int64_t trained_tokens = 0;
  double elapsed_s = 0;        // run time before this checkpoint
  int64_t metrics_bytes = -1;  // size of metrics.jsonl at this checkpoint (a resume cuts it back); -1: not recorded
  std::vector<uint64_t> requeue_groups;  // the group id of each requeue entry (empty: new ids)
  std::vector<saved_sample> saved;       // the work on those groups' samples
  bool operator==(const run_state&) const;
};

struct node_stats {
  std::string node_name;
  int64_t uptime_ns = 0;
  uint32_t peers_connected = 0;
  uint32_t peers_lost = 0;
  uint64_t trajectories_received = 0;
  uint64_t trajectories_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  bool operator==(const node_stats&) const;
};

}  // namespace areal
