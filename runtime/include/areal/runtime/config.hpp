// The run configuration and topology, loaded from TOML and validated strictly.
// The defaults are the member initializers below, and nowhere else; every key's
// type, range, meaning and the member it fills are in one table
// (runtime/src/settings.cpp), from which validation, extraction and
// `areal --help-config` all come. configs/*.toml are examples. Errors name the
// file, line:column and key path, and say what to do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace areal {

/// What a node runs. A single-node topology runs every role in one process.
enum class role : uint8_t { controller, trainer, rollout, reward };
const char* to_string(role x);
std::optional<role> parse_role(std::string_view name);
/// "controller,trainer" -> roles, or the unknown name in `bad`.
std::optional<std::vector<role>> parse_roles(std::string_view comma_separated, std::string* bad = nullptr);
std::string join(const std::vector<role>& roles);

struct node_spec {
  std::string name;
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: does not listen (allowed for a single-node topology only)
  std::vector<role> roles;
  uint32_t compute_threads = 1;
  // The devices of this node's trainer replicas and rollout workers (see the
  // `devices` key in settings.cpp); empty: model.device.
  std::vector<std::string> devices;
  uint16_t http_port = 0;               // the OpenAI-compatible endpoint (rollout nodes); 0: none
  std::string http_host = "127.0.0.1";  // where it listens; beyond loopback it needs endpoint.api_key_file
  bool has(role x) const;
};

struct cluster_spec {
  std::string app_id = "areal";   // peers with another app id are refused by CAF's middleman
  double connect_timeout_s = 30;  // how long a node retries reaching the controller node
  uint32_t heartbeat_interval_ms = 500;
  uint32_t connection_timeout_ms = 3000;  // a silent peer is declared lost after this
  bool tls = true;                        // security = "tls": mutual TLS with certificates from certs_dir
  std::string certs_dir = "certs";
  std::string weight_transport = "gloo";  // gloo or caf
  uint64_t weight_chunk_bytes = uint64_t{4} << 20;
  uint32_t transfer_timeout_ms = 60000;  // one weight transfer to one node
  double request_timeout_s = 600;        // one generation or reward request
  double trainer_timeout_s = 3600;       // one training step, checkpoint or evaluation of the trainer
  double trainer_rejoin_s = 120;         // how long a run waits for its lost trainer node to join again
};

struct run_spec {
  std::string name = "areal-run";
  std::string output_dir = "runs";
  uint64_t seed = 1;
  double hold_s = 0;            // probe job: the controller keeps the run up this long once every node joined
  bool probe_only = false;      // job = "probe": a connectivity check instead of the RL run
  uint16_t dashboard_port = 0;  // the live dashboard on 127.0.0.1 (the controller node); 0: none
};

struct reward_spec {
  uint32_t workers = 2;
  uint32_t queue_capacity = 64;
  double timeout_s = 30;
  std::string python = "/usr/bin/python3";
  uint32_t sandbox_uid_base = 61000;
  uint32_t sandbox_uid_slots = 64;
  uint64_t memory_mb = 1024;
  uint64_t output_kb = 1024;
  double math_relative_tolerance = 1e-4;
  bool math_unmarked_fallback = false;
  bool math_chain_answers_interval = false;
  bool countdown_use_all_numbers = false;
};

struct model_spec {
  std::string preset = "tiny";    // micro, tiny, small or qwen2-0.5b when no path is given
  std::string path;               // a Hugging Face model directory (config.json, safetensors, tokenizer.json)
  std::string device = "cpu";     // cpu, cuda, cuda:N
  std::string dtype = "float32";  // float32, bfloat16, float16
};

struct endpoint_spec {
  std::string model_name = "areal";  // the model id clients name (GET /v1/models)
  std::string api_key_file;          // a file holding the bearer token clients must send; empty: none
  uint64_t max_body_bytes = uint64_t{1} << 20;
  double request_timeout_s = 120;  // one model call, from its arrival to its reply
  uint32_t max_pending = 256;      // model calls generating or waiting at once; more are answered 429
  uint32_t threads = 64;           // connections served at once (each may wait for its generation)
  double episode_timeout_s = 600;  // an episode not ended by then is dropped (and a group not filled)
};

/// The agent program of an agent run (task.kind = "agent"): areal starts it
/// with the endpoint's address in its environment, to write demonstrations,
/// to run the held-out episodes and to run the training episodes.
struct agent_spec {
  std::string command;        // the program and its arguments (split at spaces); empty: agents come from outside
  int64_t demos = 0;          // chat transcripts it writes for the warm start (sft.steps > 0)
  int64_t eval_episodes = 0;  // held-out episodes before and after RL; 0: none
  double wait_s = 600;        // longest one phase of it (demos, an evaluation) may take
};

struct task_spec {
  std::string kind = "running_sums";  // or jsonl, or agent (episodes from the endpoint)
  std::string train_path;             // jsonl only
  std::string eval_path;              // jsonl only; empty: hold out the first eval.prompts training items
  int64_t max_value = 9;
  double median_terms = 3.0;
  int64_t max_terms = 8;
  double truncated_fraction = 0.0;
};

struct sft_spec {
  int64_t steps = 400;
  int64_t batch_size = 32;
  double lr = 2e-3;
  int64_t warmup_steps = 20;
};

struct rl_spec {
  bool synchronous = false;  // mode = "sync"
  int64_t steps = 60;
  int64_t eta = 2;
  int64_t group_size = 8;
  int64_t batch_size = 64;
  int64_t max_new_tokens = 96;
  double temperature = 1.0;
  double lr = 1e-4;
  int64_t warmup_steps = 0;
  std::string estimator = "grpo";
  uint32_t top_k = 0;            // sampling: the k most likely tokens only; 0: off
  double top_p = 1.0;            // sampling: the smallest set of tokens of this probability; 1: off
  double dual_clip = 0.0;        // c > 1: the dual clip of negative-advantage tokens; 0: off
  bool behaviour_clamp = false;  // behaviour_mode = "clamp": w is clamped to the cap instead of masked
  double kl_coef = 0.0;          // weight of KL(pi_theta || pi_ref), pi_ref the policy RL started from
  std::string kl_estimator = "k3";
  double reward_bias = 0.0;  // r' = clip((r + bias) * scale)
  double reward_scale = 1.0;
  double reward_clip = 0.0;     // |r'| <= clip; 0: no clip
  int64_t overlong_buffer = 0;  // responses longer than max_new_tokens - buffer lose up to overlong_factor
  double overlong_factor = 1.0;
  double clip = 0.2;
  double behaviour_cap = 5.0;
  bool decoupled = true;
  int64_t ppo_minibatches = 1;
  int64_t max_tokens_per_mb = 4096;
  int64_t rollout_workers = 1;
  int64_t rollout_slots = 64;
  std::string interruption = "reprefill";  // new weights under in-flight sequences: reprefill, keep_cache, wait
  int64_t prompt_pool_tokens = 4096;       // KV rows per engine for prompts a group shares (0: no sharing)
  int64_t max_concurrent = 128;
  int64_t checkpoint_every = 20;
  bool record_trajectories = false;  // every trained trajectory to trajectories.jsonl in the run directory
  /// The staleness bound in force: 0 in synchronous mode.
  int64_t effective_eta() const { return synchronous ? 0 : eta; }
};

/// `areal simulate`: a virtual-time run of the real controller with simulated
/// GPU members (see actors/include/areal/sim/simulation.hpp). Its run shape
/// comes from [rl] (steps, mode, eta, group_size, batch_size, max_new_tokens,
/// interruption) and run.seed.
struct simulate_spec {
  std::string device = "h800";  // the GPU roofline: h800 or h200
  std::string model = "qwen2-1.5b";
  int64_t devices = 128;
  double generation_share = 0.75;
  bool colocated = false;  // every device generates, then trains (synchronous baseline; rl.mode = "sync")
  int64_t prompt_tokens = 256;
  double length_median = 7000;
  double length_sigma = 0.8;
  std::string length_table;  // a file of response lengths; empty: the log-normal above
  double reward_median_s = 0.005;
  double reward_sigma = 0.5;
  int64_t reward_workers = 1024;
  int64_t engine_slots = 0;  // sequences per engine; 0: what its KV cache holds at the mean length
  double step_overhead_s = 0.002;
  std::string json_path;  // the result as JSON; empty: none
  std::string log_path;   // the schedule log; empty: none
};

struct eval_spec {
  int64_t prompts = 256;
  int64_t every = 20;
};

struct run_config {
  std::string source;  // the file it was read from
  run_spec run;
  cluster_spec cluster;
  reward_spec reward;
  model_spec model;
  task_spec task;
  endpoint_spec endpoint;
  agent_spec agent;
  sft_spec sft;
  rl_spec rl;
  eval_spec eval;
  simulate_spec simulate;
  std::vector<node_spec> nodes;
  /// The whole configuration with defaults filled in and overrides applied, as TOML.
  std::string resolved_toml;

  const node_spec* find_node(std::string_view name) const;
  /// The one node that hosts the controller role.
  const node_spec& controller_node() const;
};

struct config_result {
  std::optional<run_config> config;  // set when errors is empty
  std::vector<std::string> errors;   // each "file:line:column: key.path: what is wrong; what to do"
};

/// Reads, overrides and validates. `overrides` are "a.b.c=value" strings from
/// --set; value is TOML (42, 1.5, true, "text", ["a", "b"]) or else a bare string.
/// Array-of-table entries are addressed as nodes[0].port or nodes.NAME.port.
config_result load_config(const std::string& path, const std::vector<std::string>& overrides = {});
config_result parse_config(std::string_view text, const std::string& source_name,
                           const std::vector<std::string>& overrides = {});

/// A description of every key, for `areal --help-config`.
std::string describe_config_schema();

}  // namespace areal
