// The job's data sources, model, held-out set and rollout workers (see job_parts.hpp).
#include "job_parts.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>

#include "areal/actors/rollout.hpp"
#include "areal/kernels/device.hpp"
#include "areal/reward/code_verifier.hpp"
#include "areal/runtime/log.hpp"

namespace fs = std::filesystem;

namespace areal::job {

uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  return seed * 0x9E3779B97F4A7C15ull + stream;
}

// -- model --------------------------------------------------------------------

namespace {

// A copy of the policy's parameters in a model of its own, on `device` (empty: the policy's).
std::shared_ptr<kernels::policy_model> policy_copy(const model_parts& m, const std::string& device = {}) {
  auto options = m.policy->options();
  if (!device.empty())
    options = options.device(kernels::tensor_options(device, "float32").device());
  auto copy = std::make_shared<kernels::policy_model>(m.config, options);
  copy->flat().copy_(m.policy->flat());
  return copy;
}

}  // namespace

std::vector<std::string> node_devices(const run_config& c, const node_spec& self) {
  return self.devices.empty() ? std::vector<std::string>{c.model.device} : self.devices;
}

std::vector<std::string> replica_devices(const std::vector<std::string>& devices) {
  if (devices.size() < 2 || devices.front() == "cpu")
    return {};
  return {devices.begin() + 1, devices.end()};
}

model_parts make_model(const run_config& c, const node_spec& self) {
  model_parts m;
  // The parameters (float32 master weights) on the node's first device; refused
  // here, before anything runs, where this LibTorch has none such. Every other
  // device it names is checked too.
  auto devices = node_devices(c, self);
  auto master = kernels::tensor_options(devices.front(), "float32");
  for (size_t i = 1; i < devices.size(); ++i)
    kernels::tensor_options(devices[i], "float32");
  auto data = std::make_shared<job_datasets>(read_datasets(c));
  if (!c.model.path.empty()) {
    auto tokenizer_file = fs::path{c.model.path} / "tokenizer.json";
    if (!fs::is_directory(c.model.path))
      throw job_error("model.path " + c.model.path +
                      ": no such directory; give a model directory (config.json, "
                      "weights and tokenizer.json), e.g. a run's sft_model or checkpoint/model");
    if (fs::exists(fs::path{c.model.path} / "model" / "config.json"))
      throw job_error("model.path " + c.model.path + ": a run checkpoint; its model is in " +
                      (fs::path{c.model.path} / "model").string() + ": set model.path to that");
    if (!fs::exists(tokenizer_file))
      throw job_error("model.path " + c.model.path +
                      ": no tokenizer.json; a model directory needs config.json, weights and "
                      "tokenizer.json");
    m.tokenizer = std::make_shared<const kernels::tokenizer>(kernels::tokenizer::load(tokenizer_file.string()));
    m.policy = std::make_shared<kernels::policy_model>(kernels::policy_model::load(c.model.path, master));
    m.config = m.policy->config();
  } else {
    // Agent runs chat: a preset gets the ChatML tokens (chat_template.hpp).
    auto specials = c.task.kind == "agent"
                        ? std::vector<std::string>{"<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"}
                        : std::vector<std::string>{"<unk>", "<eos>"};
    m.tokenizer = std::make_shared<const kernels::tokenizer>(
        kernels::tokenizer::character_level(data_alphabet(c, *data), specials));
    m.config = kernels::preset(c.model.preset, m.tokenizer->vocab_size());
    m.config.max_position_embeddings = 1024;
    m.policy = std::make_shared<kernels::policy_model>(m.config, master);
    m.policy->init_random(stream_seed(c.run.seed, 4));
  }
  // Parameters stay float32 (the master weights); model.dtype sets the precision of the matrix products.
  m.policy->set_compute_dtype(c.model.dtype);
  m.config = m.policy->config();
  std::optional<int32_t> eos;
  for (auto name : {"<eos>", "<|endoftext|>", "</s>", "<|im_end|>"})
    if (!eos)
      eos = m.tokenizer->token_id(name);
  if (!eos)
    throw job_error("the tokenizer has no end-of-sequence token (<eos>, <|endoftext|>, </s> or <|im_end|>)");
  m.eos = *eos;
  check_inputs(c, m, *data);
  if (self.has(role::reward)) {
    // Code tasks scored here need the interpreter: without it every answer would score 0, with a verdict only.
    bool code = false;
    for (auto* items : {&data->train, &data->eval})
      for (auto& item : *items)
        code = code || item.task.kind == task_kind::code;
    if (auto problem = reward::interpreter_problem(c.reward.python); code && !problem.empty())
      throw job_error("reward.python = " + c.reward.python + ": " + problem +
                      ", and the tasks include code tasks, whose programs it runs; install python3 (apt install "
                      "python3) or set reward.python to an interpreter");
  }
  if (self.has(role::reward))
    if (auto problem = reward::helper_programs_problem(); !problem.empty())
      spdlog::warn("{}", problem);
  m.data = std::move(data);
  return m;
}

std::shared_ptr<eval_set> make_eval_set(const run_config& c, const model_parts& m) {
  auto set = std::make_shared<eval_set>();
  for (auto& item : held_out_items(c, m)) {
    set->prompts.push_back(m.tokenizer->encode(item.prompt));
    set->tasks.push_back(item.task);
    set->difficulty.push_back(
        c.task.kind == "jsonl" ? 0 : static_cast<int64_t>(std::count(item.prompt.begin(), item.prompt.end(), '+')) + 1);
  }
  return set;
}

std::string by_difficulty_text(const eval_result& r) {
  std::string out;
  for (auto& [terms, counts] : r.by_difficulty)
    out += (out.empty() ? "" : ", ") + std::to_string(terms) + " terms " + std::to_string(counts.first) + "/" +
           std::to_string(counts.second);
  return out;
}

std::shared_ptr<const kernels::chat_template> model_chat_template(const run_config& c, const model_parts& m) {
  return std::make_shared<const kernels::chat_template>(
      c.model.path.empty() ? kernels::chat_template::chatml(*m.tokenizer, true)
                           : kernels::chat_template::from_model_dir(c.model.path, *m.tokenizer));
}

std::string endpoint_api_key(const run_config& c) {
  auto& file = c.endpoint.api_key_file;
  if (file.empty())
    return {};
  std::ifstream in{file};
  std::string key;
  std::getline(in, key);
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back())))
    key.pop_back();
  if (!in && key.empty())
    throw job_error("endpoint.api_key_file = " + file + ": cannot read it; write the key into it");
  if (key.size() < 16)
    throw job_error("endpoint.api_key_file = " + file +
                    ": the key is shorter than 16 characters; use a long random one (e.g. openssl rand -hex 32)");
  return key;
}

std::unique_ptr<http_endpoint> start_endpoint(caf::actor_system& sys, const run_config& c, const node_spec& self,
                                              const model_parts& m, const std::vector<rollout_actor>& rollouts,
                                              controller_actor controller, sample_store_actor store) {
  endpoint_setup es;
  es.host = self.http_host;
  es.port = self.http_port;
  auto& e = c.endpoint;
  es.api_key = endpoint_api_key(c);
  es.model_name = e.model_name;
  es.max_body_bytes = e.max_body_bytes;
  es.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(e.request_timeout_s * 1000));
  es.max_pending = e.max_pending;
  es.threads = e.threads;
  es.episode_timeout = std::chrono::milliseconds(static_cast<int64_t>(e.episode_timeout_s * 1000));
  es.default_max_tokens = c.rl.max_new_tokens;
  es.max_seq_len = max_sequence(m.config);
  es.seed = stream_seed(c.run.seed, 8);
  es.rollouts = rollouts;
  es.controller = std::move(controller);
  es.store = std::move(store);
  es.tokenizer = m.tokenizer;
  es.eos = m.eos;
  es.name = self.name + "/endpoint";
  try {
    es.chat = model_chat_template(c, m);
  } catch (const kernels::template_error& err) {
    if (c.task.kind == "agent")
      throw job_error(std::string{"an agent run needs a chat template: "} + err.what());
    es.no_chat_reason = err.what();
  }
  try {
    return std::make_unique<http_endpoint>(sys, std::move(es));
  } catch (const std::runtime_error& err) {
    throw job_error(err.what());
  }
}

std::vector<rollout_actor> spawn_rollout_workers(caf::actor_system& sys, const run_config& c, const model_parts& m,
                                                 const node_spec& self, std::shared_ptr<compute_share> share,
                                                 std::shared_ptr<tracer> trace, int64_t initial_version,
                                                 const std::string& prefix) {
  auto devices = node_devices(c, self);
  std::vector<rollout_actor> rollouts;
  for (int64_t i = 0; i < c.rl.rollout_workers; ++i) {
    rollout_setup rs;
    rs.name = prefix + std::to_string(i);
    rs.model = policy_copy(m, devices[static_cast<size_t>(i) % devices.size()]);
    rs.tokenizer = m.tokenizer;
    rs.engine = rollout_engine_config(c, m.config);
    rs.initial_version = initial_version;
    rs.share = share;
    rs.trace = trace;
    rs.score_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.cluster.request_timeout_s * 1000));
    rollouts.push_back(spawn_rollout(sys, rs));
  }
  return rollouts;
}

weight_subscriber_setup rollout_subscription(const run_config& c, const node_spec& self, caf::actor publisher,
                                             const std::vector<rollout_actor>& rollouts, uint64_t model_bytes) {
  weight_subscriber_setup ws;
  ws.node = self.name;
  ws.publisher = std::move(publisher);
  for (auto& r : rollouts)
    ws.sinks.push_back(caf::actor_cast<caf::actor>(r));
  ws.expected_bytes = model_bytes;
  ws.device_host = self.host;
  ws.device = node_devices(c, self).front();            // the rollout workers' (first) device
  ws.allow_bulk = c.cluster.weight_transport != "caf";  // else take the bulk link the publisher offers
  ws.timeout = std::chrono::milliseconds(c.cluster.transfer_timeout_ms);
  return ws;
}

std::shared_ptr<kernels::policy_model> reference_policy(const std::filesystem::path& run_dir, bool resumed,
                                                        const model_parts& m) {
  auto kept = run_dir / "sft_model";
  if (resumed && fs::exists(kept / "config.json"))
    return std::make_shared<kernels::policy_model>(kernels::policy_model::load(kept.string(), m.policy->options()));
  return policy_copy(m);
}

}  // namespace areal::job
