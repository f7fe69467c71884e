// The table of settings (see settings.hpp): one entry per key, each naming
// the member it fills; defaults come from the member initializers of config.hpp.
#include "settings.hpp"

#include <sstream>
#include <type_traits>

namespace areal::settings {

const char* to_string(kind k) {
  switch (k) {
    case kind::boolean:
      return "a boolean";
    case kind::integer:
      return "an integer";
    case kind::number:
      return "a number";
    case kind::string:
      return "a string";
    case kind::string_list:
      return "an array of strings";
  }
  return "?";
}

value setting::fallback() const {
  if (required)
    return std::monostate{};
  return get ? get(run_config{}) : get_node(node_spec{});
}

namespace {

setting base(const char* key, kind type, double min, double max, std::vector<std::string> one_of, const char* doc) {
  setting s;
  s.key = key;
  s.type = type;
  s.min = min;
  s.max = max;
  s.one_of = std::move(one_of);
  s.doc = doc;
  return s;
}

template <class T>
constexpr kind kind_of() {
  if constexpr (std::is_same_v<T, bool>)
    return kind::boolean;
  else if constexpr (std::is_same_v<T, std::string>)
    return kind::string;
  else if constexpr (std::is_floating_point_v<T>)
    return kind::number;
  else
    return kind::integer;
}

template <class T>
value to_value(const T& x) {
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string>)
    return x;
  else if constexpr (std::is_floating_point_v<T>)
    return static_cast<double>(x);
  else
    return static_cast<int64_t>(x);
}

// Called on validated nodes only: the type is right and the value in range.
template <class T>
T from_node(const toml::node& n) {
  if constexpr (std::is_same_v<T, bool>)
    return n.value<bool>().value_or(false);
  else if constexpr (std::is_same_v<T, std::string>)
    return n.value<std::string>().value_or(std::string{});
  else if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(n.value<double>().value_or(0.0));
  else
    return static_cast<T>(n.value<int64_t>().value_or(0));
}

// A key of a section that fills `run_config::*section.*member`.
template <class S, class T>
setting in(const char* key, S run_config::*section, T S::*member, double min, double max, const char* doc,
           std::vector<std::string> one_of = {}) {
  auto s = base(key, kind_of<T>(), min, max, std::move(one_of), doc);
  s.get = [=](const run_config& c) { return to_value(c.*section.*member); };
  s.set = [=](run_config& c, const toml::node& n) { c.*section.*member = from_node<T>(n); };
  return s;
}

template <class S>
setting text(const char* key, S run_config::*section, std::string S::*member, const char* doc,
             std::vector<std::string> one_of = {}) {
  return in(key, section, member, -INFINITY, INFINITY, doc, std::move(one_of));
}

// A path where "-" means none (a TOML string cannot be left empty).
template <class S>
setting optional_path(const char* key, S run_config::*section, std::string S::*member, const char* doc) {
  auto s = base(key, kind::string, -INFINITY, INFINITY, {}, doc);
  s.get = [=](const run_config& c) { return value{(c.*section.*member).empty() ? "-" : c.*section.*member}; };
  s.set = [=](run_config& c, const toml::node& n) {
    auto x = from_node<std::string>(n);
    c.*section.*member = x == "-" ? std::string{} : x;
  };
  return s;
}

// A choice of two words that fills a boolean (the first word is false).
template <class S>
setting flag_choice(const char* key, S run_config::*section, bool S::*member, const char* off, const char* on,
                    const char* doc) {
  auto s = base(key, kind::string, -INFINITY, INFINITY, {off, on}, doc);
  s.get = [=](const run_config& c) { return value{std::string{c.*section.*member ? on : off}}; };
  s.set = [=](run_config& c, const toml::node& n) { c.*section.*member = from_node<std::string>(n) == on; };
  return s;
}

template <class T>
setting node_key(const char* key, T node_spec::*member, double min, double max, const char* doc) {
  auto s = base(key, kind_of<T>(), min, max, {}, doc);
  s.get_node = [=](const node_spec& n) { return to_value(n.*member); };
  s.set_node = [=](node_spec& n, const toml::node& x) { n.*member = from_node<T>(x); };
  return s;
}

constexpr double inf = INFINITY;

std::vector<section> make_table() {
  using c = run_config;
  std::vector<section> t;
  t.push_back(
      {"run",
       false,
       "What this run is called and where its outputs go.",
       {
           text("name", &c::run, &run_spec::name,
                "run name; the run directory is output_dir/name (a relative name: no leading /, no . or .. in it)"),
           text("output_dir", &c::run, &run_spec::output_dir,
                "parent directory of run directories (relative to the working directory)"),
           in("seed", &c::run, &run_spec::seed, 0, 9.007199254740992e15, "seed of every random stream"),
           in("hold_s", &c::run, &run_spec::hold_s, 0, 86400,
              "probe job: seconds the controller keeps the run up after every node joined"),
           flag_choice("job", &c::run, &run_spec::probe_only, "rl", "probe",
                       "rl: the RL run; probe: a connectivity check of the topology (every node joins and "
                       "exchanges a trajectory, then the run ends)"),
           in("dashboard_port", &c::run, &run_spec::dashboard_port, 0, 65535,
              "the live dashboard: the process that runs the job serves the report page of the run on "
              "127.0.0.1 at this port while the run lasts (0: none; off by default for shared hosts)"),
       }});
  auto chunk = base("weight_chunk_kb", kind::integer, 64, 1048576, {},
                    "weights travel in chunks of this size, each with its own checksum");
  chunk.get = [](const run_config& x) { return value{static_cast<int64_t>(x.cluster.weight_chunk_bytes / 1024)}; };
  chunk.set = [](run_config& x, const toml::node& n) { x.cluster.weight_chunk_bytes = from_node<uint64_t>(n) * 1024; };
  t.push_back(
      {"cluster",
       false,
       "How the nodes find, authenticate and watch each other.",
       {
           text("app_id", &c::cluster, &cluster_spec::app_id, "cluster identifier; CAF refuses peers with another one"),
           in("connect_timeout_s", &c::cluster, &cluster_spec::connect_timeout_s, 0.1, 3600,
              "how long a node retries reaching the controller node before giving up"),
           in("heartbeat_interval_ms", &c::cluster, &cluster_spec::heartbeat_interval_ms, 10, 60000,
              "interval of the middleman's heartbeats"),
           in("connection_timeout_ms", &c::cluster, &cluster_spec::connection_timeout_ms, 100, 600000,
              "a peer silent this long is declared lost (must exceed heartbeat_interval_ms)"),
           flag_choice("security", &c::cluster, &cluster_spec::tls, "plain", "tls",
                       "tls: nodes authenticate each other with certificates from certs_dir (mutual TLS); plain: no "
                       "authentication or encryption (say so explicitly; for loopback tests)"),
           text("certs_dir", &c::cluster, &cluster_spec::certs_dir,
                "directory of ca.pem and NODE.pem / NODE.key (areal --config T --make-certs writes them)"),
           text("weight_transport", &c::cluster, &cluster_spec::weight_transport,
                "how new weights reach rollout nodes: gloo (a c10d Gloo link per node), nccl (a two-rank NCCL "
                "communicator per node; GPU builds) or caf (chunk messages)",
                {"gloo", "caf", "nccl"}),
           chunk,
           in("transfer_timeout_ms", &c::cluster, &cluster_spec::transfer_timeout_ms, 100, 3600000,
              "deadline of one weight transfer to one node"),
           in("request_timeout_s", &c::cluster, &cluster_spec::request_timeout_s, 1, 86400,
              "deadline of one generation or reward request; a sample whose request fails is generated again"),
           in("trainer_timeout_s", &c::cluster, &cluster_spec::trainer_timeout_s, 1, 604800,
              "deadline of one training step, checkpoint or evaluation on the trainer; past it a step or "
              "checkpoint ends the run with that reason (resume from the last checkpoint on disk), an "
              "evaluation is skipped"),
           in("trainer_rejoin_s", &c::cluster, &cluster_spec::trainer_rejoin_s, 0, 86400,
              "with the trainer on a node of its own: how long the run waits for that node to join again after "
              "it was lost (the run goes back to its last checkpoint, the other nodes keep running); 0: losing "
              "it ends the run"),
       }});
  t.push_back({"model",
               false,
               "The policy model: a preset or a Hugging Face directory, and where it runs.",
               {
                   text("preset", &c::model, &model_spec::preset,
                        "model shape when no path is given (micro: about 0.1 M parameters, tiny: about 3 M, small: "
                        "about 25 M; qwen2-0.5b: Qwen2-0.5B's shape, about 360 M besides the embedding, for GPUs)",
                        {"micro", "tiny", "small", "qwen2-0.5b"}),
                   optional_path("path", &c::model, &model_spec::path,
                                 "Hugging Face model directory to load, or - for a fresh preset"),
                   text("device", &c::model, &model_spec::device,
                        "where the model runs: cpu, or cuda / cuda:N with a LibTorch built with CUDA (refused at "
                        "the start where it has none); weights travel between nodes through host memory"),
                   text("dtype", &c::model, &model_spec::dtype,
                        "precision of the matrix products: float32, or bfloat16 (parameters, optimizer state, "
                        "norms and softmax stay float32); float16 is refused on CPU",
                        {"float32", "bfloat16", "float16"}),
               }});
  t.push_back(
      {"reward",
       false,
       "The reward service: verification workers and the code sandbox.",
       {
           in("workers", &c::reward, &reward_spec::workers, 1, 256, "parallel verification workers (one thread each)"),
           in("queue_capacity", &c::reward, &reward_spec::queue_capacity, 1, 1e6,
              "verifications accepted at once (queued + running); more are refused: back-pressure"),
           in("timeout_s", &c::reward, &reward_spec::timeout_s, 0.1, 3600,
              "deadline of one verification, from when a worker starts it; past it the verdict is timeout and the "
              "worker is replaced"),
           text("python", &c::reward, &reward_spec::python,
                "interpreter for code tasks (absolute path, readable by every user)"),
           in("sandbox_uid_base", &c::reward, &reward_spec::sandbox_uid_base, 1000, 4e9,
              "first of the user ids sandboxed programs run as when areal runs as root (ids with no account: "
              "each concurrent run leases two of its own)"),
           in("sandbox_uid_slots", &c::reward, &reward_spec::sandbox_uid_slots, 1, 65536,
              "concurrent sandbox runs on one machine (two user ids each, from sandbox_uid_base)"),
           in("memory_mb", &c::reward, &reward_spec::memory_mb, 16, 65536,
              "address-space limit of a sandboxed program"),
           in("output_kb", &c::reward, &reward_spec::output_kb, 1, 1048576,
              "stdout + stderr kept from a sandboxed program; writing more ends it"),
           in("math_relative_tolerance", &c::reward, &reward_spec::math_relative_tolerance, 0, 1,
              "relative tolerance for math answers whose reference is a decimal (integers and fractions: exact)"),
           in("math_unmarked_fallback", &c::reward, &reward_spec::math_unmarked_fallback, -inf, inf,
              "read a math response with no marked answer (\\boxed{}, \"the answer is\") by its last math, or a "
              "number standing after it; off: "
              "such a response has no answer (tasks whose responses are bare numbers, like running sums, say so "
              "themselves)"),
           in("math_chain_answers_interval", &c::reward, &reward_spec::math_chain_answers_interval, -inf, inf,
              "accept an answer written as a chain of inequalities (-2 <= x <= 7) for a reference interval "
              "(x in [-2, 7]); the interval always answers the chain (off: Math-Verify's default)"),
           in("countdown_use_all_numbers", &c::reward, &reward_spec::countdown_use_all_numbers, -inf, inf,
              "countdown answers must use every given number"),
       }});
  t.push_back(
      {"task",
       false,
       "The training and evaluation prompts: a seeded generator or JSONL files.",
       {
           text("kind", &c::task, &task_spec::kind,
                "running_sums: the built-in generator; jsonl: train_path and eval_path; agent: episodes that agents "
                "run through the endpoint (a node's http_port), with the rewards they give",
                {"running_sums", "jsonl", "agent"}),
           optional_path("train_path", &c::task, &task_spec::train_path, "JSONL training prompts (kind jsonl)"),
           optional_path("eval_path", &c::task, &task_spec::eval_path,
                         "JSONL held-out prompts (kind jsonl; - : the first eval.prompts training items are held out)"),
           in("max_value", &c::task, &task_spec::max_value, 1, 1e6, "running sums: largest term"),
           in("median_terms", &c::task, &task_spec::median_terms, 2, 64,
              "running sums: median number of terms (log-normal)"),
           in("max_terms", &c::task, &task_spec::max_terms, 2, 64, "running sums: most terms"),
           in("truncated_fraction", &c::task, &task_spec::truncated_fraction, 0, 1,
              "running sums: share of SFT demonstrations that stop one partial sum short (RL teaches to finish)"),
       }});
  auto body = base("max_body_kb", kind::integer, 1, 1048576, {}, "largest request body; a larger one is answered 413");
  body.get = [](const run_config& x) { return value{static_cast<int64_t>(x.endpoint.max_body_bytes / 1024)}; };
  body.set = [](run_config& x, const toml::node& n) { x.endpoint.max_body_bytes = from_node<uint64_t>(n) * 1024; };
  t.push_back({"endpoint",
               false,
               "The OpenAI-compatible HTTP endpoint of rollout nodes (a node's http_port turns it on).",
               {
                   text("model_name", &c::endpoint, &endpoint_spec::model_name,
                        "the model id clients name in requests and GET /v1/models lists"),
                   optional_path("api_key_file", &c::endpoint, &endpoint_spec::api_key_file,
                                 "file holding the API key clients send as \"Authorization: Bearer KEY\" (- : none; "
                                 "required when http_host is not a loopback address)"),
                   body,
                   in("request_timeout_s", &c::endpoint, &endpoint_spec::request_timeout_s, 0.1, 86400,
                      "deadline of one model call; past it the call is answered 503 and its generation stopped"),
                   in("max_pending", &c::endpoint, &endpoint_spec::max_pending, 1, 1e6,
                      "model calls generating or waiting at once; more are answered 429"),
                   in("threads", &c::endpoint, &endpoint_spec::threads, 1, 4096,
                      "connections served at once (each waits for its generation); more wait for a free one"),
                   in("episode_timeout_s", &c::endpoint, &endpoint_spec::episode_timeout_s, 1, 86400 * 7,
                      "an episode not ended within this is dropped with the reason; a task's group not filled by "
                      "then is dropped"),
               }});
  t.push_back(
      {"agent",
       false,
       "The agent program of an agent run (task.kind = \"agent\"), started by areal with the endpoint's address "
       "in its environment (OPENAI_BASE_URL, AREAL_BASE_URL, AREAL_AGENT_MODE: demos, eval or train).",
       {
           optional_path("command", &c::agent, &agent_spec::command,
                         "the agent program and its arguments, split at spaces (a bare name is looked for beside "
                         "the areal binary, then on PATH; - : none, agents come from outside)"),
           in("demos", &c::agent, &agent_spec::demos, 0, 1e7,
              "chat transcripts the agent writes (mode demos) for the warm start, when sft.steps > 0"),
           in("eval_episodes", &c::agent, &agent_spec::eval_episodes, 0, 1e7,
              "held-out episodes the agent runs greedily (mode eval) before and after RL; 0: none"),
           in("wait_s", &c::agent, &agent_spec::wait_s, 1, 86400,
              "longest the demos or one evaluation may take; then the agent is stopped and the run ends"),
       }});
  t.push_back({"sft",
               false,
               "The supervised warm start on worked solutions, before RL.",
               {
                   in("steps", &c::sft, &sft_spec::steps, 0, 1e7, "optimizer steps (0: no warm start)"),
                   in("batch_size", &c::sft, &sft_spec::batch_size, 1, 1e5, "demonstrations per step"),
                   in("lr", &c::sft, &sft_spec::lr, 0, 1, "peak learning rate (cosine decay to a tenth)"),
                   in("warmup_steps", &c::sft, &sft_spec::warmup_steps, 0, 1e7, "linear warmup steps"),
               }});
  t.push_back(
      {"rl",
       false,
       "Reinforcement learning: the pipeline, the staleness bound and the decoupled PPO objective.",
       {
           flag_choice("mode", &c::rl, &rl_spec::synchronous, "async", "sync",
                       "async: rollout and trainer run concurrently under eta; sync: they alternate (eta = 0)"),
           in("steps", &c::rl, &rl_spec::steps, 0, 1e7, "training steps (policy versions) of the run"),
           in("eta", &c::rl, &rl_spec::eta, 0, 1000, "staleness bound in versions (async mode)"),
           in("group_size", &c::rl, &rl_spec::group_size, 1, 4096, "samples per prompt (one group)"),
           in("batch_size", &c::rl, &rl_spec::batch_size, 1, 1e6,
              "trajectories per training step; a multiple of group_size"),
           in("max_new_tokens", &c::rl, &rl_spec::max_new_tokens, 1, 1e6, "longest response"),
           in("temperature", &c::rl, &rl_spec::temperature, 0.01, 100,
              "sampling temperature (the trainer uses the same)"),
           in("top_k", &c::rl, &rl_spec::top_k, 0, 1e6, "sampling: only the k most likely tokens (0: off)"),
           in("top_p", &c::rl, &rl_spec::top_p, 0.001, 1,
              "sampling: only the most likely tokens whose probabilities add up to top_p (1: off)"),
           in("lr", &c::rl, &rl_spec::lr, 0, 1, "learning rate (constant after warmup)"),
           in("warmup_steps", &c::rl, &rl_spec::warmup_steps, 0, 1e7, "linear warmup steps"),
           text("estimator", &c::rl, &rl_spec::estimator, "group-relative advantage estimator",
                {"grpo", "dr_grpo", "rloo"}),
           in("clip", &c::rl, &rl_spec::clip, 0, 10, "PPO clip range epsilon"),
           in("dual_clip", &c::rl, &rl_spec::dual_clip, 0, 1000,
              "dual clip c > 1: the loss of a negative-advantage token is at most c times its advantage (0: off)"),
           in("behaviour_cap", &c::rl, &rl_spec::behaviour_cap, 1, 1e6,
              "tokens whose importance weight pi_prox/pi_behav exceeds this are masked (or clamped)"),
           flag_choice("behaviour_mode", &c::rl, &rl_spec::behaviour_clamp, "mask", "clamp",
                       "tokens over behaviour_cap: mask (left out of the loss) or clamp (weight set to the cap)"),
           in("decoupled", &c::rl, &rl_spec::decoupled, -inf, inf,
              "decoupled PPO (behaviour, proximal, current policy); false: plain PPO anchored at the behaviour "
              "policy"),
           in("kl_coef", &c::rl, &rl_spec::kl_coef, 0, 100,
              "weight of the KL penalty to the policy RL started from (0: off; one more forward pass per batch)"),
           text("kl_estimator", &c::rl, &rl_spec::kl_estimator, "estimator of the KL penalty", {"k1", "k2", "k3"}),
           in("reward_bias", &c::rl, &rl_spec::reward_bias, -1e6, 1e6,
              "reward shaping before advantages: r' = clip((r + bias) * scale)"),
           in("reward_scale", &c::rl, &rl_spec::reward_scale, -1e6, 1e6, "reward shaping: the scale"),
           in("reward_clip", &c::rl, &rl_spec::reward_clip, 0, 1e6, "reward shaping: |r'| <= clip (0: no clip)"),
           in("overlong_buffer", &c::rl, &rl_spec::overlong_buffer, 0, 1e6,
              "responses longer than max_new_tokens - overlong_buffer lose up to overlong_factor of reward, "
              "linearly (0: off)"),
           in("overlong_factor", &c::rl, &rl_spec::overlong_factor, 0, 1e6,
              "the reward lost by a response of max_new_tokens"),
           in("ppo_minibatches", &c::rl, &rl_spec::ppo_minibatches, 1, 1024, "optimizer steps per training batch"),
           in("max_tokens_per_mb", &c::rl, &rl_spec::max_tokens_per_mb, 16, 1e9,
              "token budget of one packed micro-batch (of whole sequences: at least the longest prompt plus "
              "max_new_tokens, and the longest warm-start demonstration; checked at the start)"),
           in("rollout_workers", &c::rl, &rl_spec::rollout_workers, 1, 1024, "generation engines on this node"),
           in("rollout_slots", &c::rl, &rl_spec::rollout_slots, 1, 1e5, "sequences one engine decodes together"),
           in("max_concurrent", &c::rl, &rl_spec::max_concurrent, 1, 1e6, "requests in flight over all engines"),
           text("interruption", &c::rl, &rl_spec::interruption,
                "new weights under in-flight sequences: reprefill (drop their KV caches and recompute them with the "
                "new weights; exact), keep_cache (keep the caches the old weights computed; no recomputation, "
                "behaviour log-probabilities of a mixed policy), wait (start nothing new until they finish with the "
                "old weights)",
                {"reprefill", "keep_cache", "wait"}),
           in("prompt_pool_tokens", &c::rl, &rl_spec::prompt_pool_tokens, 0, 1e7,
              "KV-cache rows per engine for prompts that sequences share: the samples of a group prefill their "
              "prompt once and read it from there (0: every sequence prefills its own)"),
           in("checkpoint_every", &c::rl, &rl_spec::checkpoint_every, 0, 1e7,
              "steps between run checkpoints (0: only at the end and on SIGINT)"),
           in("record_trajectories", &c::rl, &rl_spec::record_trajectories, -inf, inf,
              "append every trained trajectory (tokens, loss mask, versions, behaviour log-probabilities, reward) "
              "to trajectories.jsonl in the run directory, for inspection (large)"),
       }});
  t.push_back(
      {"eval",
       false,
       "Held-out evaluation with greedy decoding.",
       {
           in("prompts", &c::eval, &eval_spec::prompts, 0, 1e7, "held-out prompts (0: no evaluation)"),
           in("every", &c::eval, &eval_spec::every, 0, 1e7, "steps between evaluations (0: before and after only)"),
       }});
  t.push_back(
      {"simulate",
       false,
       "areal simulate: a virtual-time run of the real controller with simulated GPU rollout engines, reward "
       "scorers and trainer (the run's shape from [rl]: steps, mode, eta, group_size, batch_size, max_new_tokens, "
       "interruption; and run.seed). Only `areal simulate` reads this section.",
       {
           text("device", &c::simulate, &simulate_spec::device, "the GPUs' roofline (datasheet and measured rates)",
                {"h800", "h200"}),
           text("model", &c::simulate, &simulate_spec::model, "the Qwen2 shape trained",
                {"qwen2-1.5b", "qwen2-7b", "qwen2-14b", "qwen2-32b"}),
           in("devices", &c::simulate, &simulate_spec::devices, 1, 1e6, "GPUs of the run"),
           in("generation_share", &c::simulate, &simulate_spec::generation_share, 0.01, 0.99,
              "share of the GPUs that generate (the others train)"),
           in("colocated", &c::simulate, &simulate_spec::colocated, -inf, inf,
              "every GPU generates, then every GPU trains (needs rl.mode = \"sync\")"),
           in("prompt_tokens", &c::simulate, &simulate_spec::prompt_tokens, 1, 1e6, "tokens of every prompt"),
           in("length_median", &c::simulate, &simulate_spec::length_median, 1, 1e7,
              "median response tokens (log-normal, capped at rl.max_new_tokens)"),
           in("length_sigma", &c::simulate, &simulate_spec::length_sigma, 0, 5, "spread of the log-normal"),
           optional_path("length_table", &c::simulate, &simulate_spec::length_table,
                         "a file of response lengths (one per line, or LENGTH COUNT) drawn instead of the "
                         "log-normal; - : none"),
           in("reward_median_s", &c::simulate, &simulate_spec::reward_median_s, 0, 3600,
              "median seconds to score one answer (log-normal)"),
           in("reward_sigma", &c::simulate, &simulate_spec::reward_sigma, 0, 5, "spread of the scoring time"),
           in("reward_workers", &c::simulate, &simulate_spec::reward_workers, 1, 1e7, "answers scored at once"),
           in("engine_slots", &c::simulate, &simulate_spec::engine_slots, 0, 1e6,
              "sequences one engine holds (0: what its KV cache holds at the mean length)"),
           in("step_overhead_s", &c::simulate, &simulate_spec::step_overhead_s, 0, 10,
              "fixed seconds of every decode step (an assumption; no GPU measured it)"),
           optional_path("json", &c::simulate, &simulate_spec::json_path, "write the result here as JSON; - : no"),
           optional_path("log", &c::simulate, &simulate_spec::log_path,
                         "write the schedule log here (every dispatch, completion, score, step, weight load); - : no"),
       }});
  auto name = node_key("name", &node_spec::name, -inf, inf, "unique node name, used by --node");
  name.required = true;
  auto roles =
      base("roles", kind::string_list, -inf, inf, {"controller", "trainer", "rollout", "reward"}, "what the node runs");
  roles.required = true;
  roles.get_node = [](const node_spec& n) {
    std::vector<std::string> out;
    for (auto r : n.roles)
      out.emplace_back(to_string(r));
    return value{out};
  };
  roles.set_node = [](node_spec& n, const toml::node& x) {
    n.roles.clear();
    for (auto& r : *x.as_array())
      n.roles.push_back(*parse_role(r.value_or(std::string{})));
  };
  auto devices = base("devices", kind::string_list, -inf, inf, {},
                      "the node's devices (\"cpu\", \"cuda\" or \"cuda:N\"), instead of model.device: its trainer's "
                      "data-parallel replicas one on each (on the CPU, one per compute thread), its rollout workers "
                      "on them in turn (worker i on entry i mod the count); [] : model.device");
  devices.get_node = [](const node_spec& n) { return value{n.devices}; };
  devices.set_node = [](node_spec& n, const toml::node& x) {
    n.devices.clear();
    for (auto& d : *x.as_array())
      n.devices.push_back(d.value_or(std::string{}));
  };
  t.push_back(
      {"nodes",
       true,
       "One [[nodes]] entry per process of the topology.",
       {
           name,
           node_key("host", &node_spec::host, -inf, inf, "address the node listens on and peers connect to"),
           node_key("port", &node_spec::port, 0, 65535, "TCP port (0: no listening; only for a single-node topology)"),
           roles,
           node_key("compute_threads", &node_spec::compute_threads, 1, 1024, "threads for LibTorch work on this node"),
           devices,
           node_key("http_port", &node_spec::http_port, 0, 65535,
                    "port of the node's OpenAI-compatible endpoint (rollout nodes; 0: none)"),
           node_key("http_host", &node_spec::http_host, -inf, inf,
                    "address the endpoint listens on (beyond loopback: endpoint.api_key_file is required)"),
       }});
  return t;
}

}  // namespace

const std::vector<section>& table() {
  static const std::vector<section> sections = make_table();
  return sections;
}

run_config extract(const toml::table& root, const std::string& source) {
  run_config c;
  c.source = source;
  for (auto& s : table()) {
    if (!s.array_of_tables) {
      auto& t = *root[s.name].as_table();
      for (auto& f : s.settings)
        f.set(c, *t.get(f.key));
      continue;
    }
    for (auto& entry : *root[s.name].as_array()) {
      auto& t = *entry.as_table();
      node_spec n;
      for (auto& f : s.settings)
        f.set_node(n, *t.get(f.key));
      c.nodes.push_back(std::move(n));
    }
  }
  std::ostringstream os;
  os << "# Resolved configuration of run \"" << c.run.name << "\": read from " << source
     << ", overrides applied, defaults filled in.\n"
     << root << "\n";
  c.resolved_toml = os.str();
  return c;
}

}  // namespace areal::settings
