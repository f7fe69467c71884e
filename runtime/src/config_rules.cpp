// The rules of a configuration document that span keys (config_checks.hpp):
// the topology (names, endpoints, one controller, roles, devices), batch and
// group sizes, and what this build supports.
#include "config_checks.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

namespace areal::config_checks {

namespace {

// model.device as kernels::tensor_options reads it: cpu, cuda or cuda:N.
bool valid_device_name(const std::string& d) {
  return d == "cpu" || d == "cuda" || (d.rfind("cuda:", 0) == 0 && all_digits(d.substr(5)));
}

}  // namespace

void check_rules(toml::table& root, context& ctx) {
  auto* nodes = root["nodes"].as_array();
  if (!nodes)
    return;
  std::map<std::string, const toml::node*> names;
  std::map<std::string, const toml::node*> endpoints;
  std::vector<const toml::table*> controllers;
  for (size_t i = 0; i < nodes->size(); ++i) {
    auto* t = (*nodes)[i].as_table();
    if (!t)
      continue;
    auto prefix = "nodes[" + std::to_string(i) + "].";
    auto name = (*t)["name"].value<std::string>();
    if (name) {
      auto [it, fresh] = names.emplace(*name, t->get("name"));
      if (!fresh)
        ctx.fail(ctx.where(t->get("name")), prefix + "name",
                 "duplicate node name \"" + *name + "\" (first defined at " + ctx.where(it->second) +
                     "); give every node a unique name");
    }
    auto host = (*t)["host"].value<std::string>();
    auto port = (*t)["port"].value<int64_t>();
    if (host && port && *port != 0) {
      auto endpoint = *host + ":" + std::to_string(*port);
      auto [it, fresh] = endpoints.emplace(endpoint, t->get("port"));
      if (!fresh)
        ctx.fail(ctx.where(t->get("port")), prefix + "port",
                 "port clash: " + endpoint + " is already used by the node at " + ctx.where(it->second) +
                     "; give each node on one host its own port");
    }
    if (nodes->size() > 1 && port && *port == 0)
      ctx.fail(ctx.where(t->get("port") ? t->get("port") : t), prefix + "port",
               "a topology of several nodes needs every node to listen; set a port in [1, 65535]");
    if (auto* roles = (*t)["roles"].as_array()) {
      std::set<std::string> seen;
      for (auto& r : *roles)
        if (auto s = r.value<std::string>()) {
          if (!seen.insert(*s).second)
            ctx.fail(ctx.where(&r), prefix + "roles", "role \"" + *s + "\" is listed twice");
          if (*s == "controller")
            controllers.push_back(t);
        }
    }
  }
  if (controllers.size() != 1 && ctx.errors.empty()) {
    std::string where = controllers.size() > 1 ? ctx.where(controllers[1]) : ctx.where(nodes);
    ctx.fail(where, "nodes",
             std::to_string(controllers.size()) +
                 " nodes have the role \"controller\"; exactly one node must host the controller");
  }
  auto heartbeat = root["cluster"]["heartbeat_interval_ms"].value<int64_t>();
  auto timeout = root["cluster"]["connection_timeout_ms"].value<int64_t>();
  if (heartbeat && timeout && *timeout <= *heartbeat)
    ctx.fail(ctx.where(root["cluster"]["connection_timeout_ms"].node()), "cluster.connection_timeout_ms",
             "must exceed cluster.heartbeat_interval_ms (" + std::to_string(*heartbeat) +
                 "), or every peer is declared lost between two heartbeats");
  auto group = root["rl"]["group_size"].value<int64_t>();
  auto batch = root["rl"]["batch_size"].value<int64_t>();
  if (group && batch && *batch % *group != 0)
    ctx.fail(ctx.where(root["rl"]["batch_size"].node()), "rl.batch_size",
             std::to_string(*batch) + " is not a multiple of rl.group_size (" + std::to_string(*group) +
                 "): a batch holds whole groups; use e.g. " +
                 std::to_string(std::max<int64_t>(1, *batch / *group) * *group));
  bool rl_run = root["run"]["job"].value<std::string>().value_or("rl") == "rl";
  // The probe checks the connections between nodes; one node runs the whole job in one process.
  if (!rl_run && nodes->size() == 1)
    ctx.fail(ctx.where(root["run"]["job"].node()), "run.job",
             "\"probe\" checks the connections between a topology's nodes, and this topology has one node (it "
             "runs every role in one process: nothing to connect); use a topology of several nodes, e.g. "
             "configs/two_nodes.toml, or job = \"rl\"");
  auto hold = root["run"]["hold_s"].value<double>();
  if (rl_run && hold && *hold > 0)
    ctx.fail(ctx.where(root["run"]["hold_s"].node()), "run.hold_s",
             format_number(*hold) +
                 ": only the probe job (run.job = \"probe\") holds the run up; an RL run ends when its steps are "
                 "done. Remove it, or set run.job = \"probe\"");
  if (rl_run && group && *group == 1)
    ctx.fail(ctx.where(root["rl"]["group_size"].node()), "rl.group_size",
             "1: every advantage estimator here (grpo, dr_grpo, rloo) compares a sample with the others of its "
             "group, so a group of one has advantage 0 and nothing is learned; use at least 2");
  if (auto name = root["run"]["name"].value<std::string>(); name && !name->empty()) {
    // The run directory is output_dir/name: a name that is absolute or steps up puts it elsewhere, and "." is
    // output_dir itself (where --fresh would move every other run aside with it).
    bool stays_inside = name->front() != '/';
    for (size_t first = 0; stays_inside && first <= name->size();) {
      auto end = std::min(name->find('/', first), name->size());
      auto part = name->substr(first, end - first);
      stays_inside = part != "." && part != ".." && (end == name->size() || !part.empty());
      first = end + 1;
    }
    if (!stays_inside)
      ctx.fail(ctx.where(root["run"]["name"].node()), "run.name",
               "\"" + *name +
                   "\" is not a name inside run.output_dir (the run directory is output_dir/name); use a plain "
                   "name such as \"demo\" (folders such as \"sweep/lr1\" are fine), or --run-dir DIR to put the run "
                   "anywhere");
  }
  auto kind = root["task"]["kind"].value<std::string>();
  auto train = root["task"]["train_path"].value<std::string>();
  if (kind && *kind == "jsonl" && train && *train == "-")
    ctx.fail(ctx.where(root["task"]["kind"].node()), "task.kind",
             "jsonl needs task.train_path (a JSONL file of prompts); set it, or use kind = \"running_sums\"");
  for (auto key : {"train_path", "eval_path"}) {
    auto path = root["task"][key].value<std::string>();
    if (kind && *kind != "jsonl" && path && *path != "-")
      ctx.fail(ctx.where(root["task"][key].node()), std::string{"task."} + key,
               "is read only by kind = \"jsonl\" and task.kind is \"" + *kind +
                   "\" (its tasks are generated); remove it, or set kind = \"jsonl\"");
  }

  // Whether this LibTorch has the device is known when the model is made (the
  // run's start): here, only the spelling.
  auto device = root["model"]["device"].value<std::string>();
  if (device && !valid_device_name(*device))
    ctx.fail(ctx.where(root["model"]["device"].node()), "model.device",
             "\"" + *device + "\" is no device; use \"cpu\", \"cuda\" or \"cuda:N\" (N: the GPU's index)");
  auto dtype = root["model"]["dtype"].value<std::string>();
  if (dtype && *dtype == "float16")
    ctx.fail(ctx.where(root["model"]["dtype"].node()), "model.dtype",
             "\"float16\": LibTorch's CPU autocast has no float16 kernels; use \"bfloat16\" (float32 parameters, "
             "bfloat16 matrix products) or \"float32\"");
  auto dual = root["rl"]["dual_clip"].value<double>();
  if (dual && *dual > 0 && *dual <= 1)
    ctx.fail(ctx.where(root["rl"]["dual_clip"].node()), "rl.dual_clip",
             format_number(*dual) +
                 " is no dual clip (it bounds the loss at c times the advantage, c > 1); use 0 "
                 "(off) or e.g. 3");
  auto buffer = root["rl"]["overlong_buffer"].value<int64_t>();
  auto longest = root["rl"]["max_new_tokens"].value<int64_t>();
  if (buffer && longest && *buffer > *longest)
    ctx.fail(ctx.where(root["rl"]["overlong_buffer"].node()), "rl.overlong_buffer",
             std::to_string(*buffer) + " exceeds rl.max_new_tokens (" + std::to_string(*longest) +
                 "); use at most that (0: no overlong penalty)");

  // The endpoint: on a rollout node (the controller's in this build), behind a key beyond loopback.
  bool any_endpoint = false;
  for (size_t i = 0; ctx.errors.empty() && i < nodes->size(); ++i) {
    auto* t = (*nodes)[i].as_table();
    if (!t)
      continue;
    auto port = (*t)["http_port"].value<int64_t>().value_or(0);
    if (port == 0)
      continue;
    any_endpoint = true;
    auto key = "nodes[" + std::to_string(i) + "].http_port";
    bool rollout = false, controller = false;
    if (auto* roles = (*t)["roles"].as_array())
      for (auto& r : *roles) {
        rollout = rollout || r.value<std::string>() == "rollout";
        controller = controller || r.value<std::string>() == "controller";
      }
    if (!rollout)
      ctx.fail(ctx.where((*t)["http_port"].node()), key,
               "the endpoint generates with its node's rollout workers, and this node has no \"rollout\" role; "
               "add it, or set http_port on a rollout node");
    else if (!controller)
      ctx.fail(ctx.where((*t)["http_port"].node()), key,
               "this build serves the endpoint on the controller's node only (episodes go to the controller and "
               "the sample store from there); set http_port on the node with the \"controller\" role");
    auto host = (*t)["http_host"].value<std::string>().value_or("127.0.0.1");
    bool loopback = host.rfind("127.", 0) == 0 || host == "::1" || host == "localhost";
    auto key_file = root["endpoint"]["api_key_file"].value<std::string>().value_or("-");
    if (!loopback && key_file == "-")
      ctx.fail(ctx.where((*t)["http_host"].node()), "nodes[" + std::to_string(i) + "].http_host",
               "\"" + host +
                   "\" is reachable beyond this machine, and the endpoint has no API key; set endpoint.api_key_file "
                   "(a file holding the key clients send as a bearer token), or listen on 127.0.0.1");
  }
  if (rl_run && kind && *kind == "agent") {
    if (ctx.errors.empty() && !any_endpoint)
      ctx.fail(ctx.where(root["task"]["kind"].node()), "task.kind",
               "\"agent\" trains on episodes that agents run through the endpoint, and no node has an http_port; "
               "set http_port on the controller's node (which needs the \"rollout\" role)");
    auto command = root["agent"]["command"].value<std::string>().value_or("-");
    bool has_command = command != "-" && !command.empty();
    auto sft = root["sft"]["steps"].value<int64_t>().value_or(0);
    auto demos = root["agent"]["demos"].value<int64_t>().value_or(0);
    if (sft > 0 && (!has_command || demos <= 0))
      ctx.fail(ctx.where(root["sft"]["steps"].node()), "sft.steps",
               std::to_string(sft) +
                   ": an agent run warm-starts on the chat transcripts its agent program writes; set "
                   "agent.command and agent.demos > 0, or sft.steps = 0 and start from a model directory "
                   "(model.path) trained before");
    auto evals = root["eval"]["prompts"].value<int64_t>().value_or(0);
    if (evals > 0)
      ctx.fail(ctx.where(root["eval"]["prompts"].node()), "eval.prompts",
               std::to_string(evals) +
                   ": in agent runs the agent measures success on its held-out episodes; set eval.prompts = 0 "
                   "and agent.eval_episodes instead");
    auto agent_evals = root["agent"]["eval_episodes"].value<int64_t>().value_or(0);
    if (agent_evals > 0 && !has_command)
      ctx.fail(ctx.where(root["agent"]["eval_episodes"].node()), "agent.eval_episodes",
               std::to_string(agent_evals) + ": the held-out episodes are run by the agent program; set agent.command");
  } else if (!(kind && *kind == "agent") && root["agent"]["command"].value<std::string>().value_or("-") != "-") {
    ctx.fail(ctx.where(root["agent"]["command"].node()), "agent.command",
             "an agent program drives agent runs only; set task.kind = \"agent\" or remove agent.command");
  }

  // A node's devices: spelled as model.device, one kind, each once, all used.
  auto workers = root["rl"]["rollout_workers"].value<int64_t>().value_or(1);
  for (size_t i = 0; ctx.errors.empty() && i < nodes->size(); ++i) {
    auto* t = (*nodes)[i].as_table();
    auto* list = t ? (*t)["devices"].as_array() : nullptr;
    if (!list || list->empty())
      continue;
    auto key = "nodes[" + std::to_string(i) + "].devices";
    auto at = ctx.where(list);
    std::vector<std::string> seen;
    bool cpu = false, gpu = false;
    for (auto& item : *list) {
      auto d = item.value<std::string>().value_or("");
      if (!valid_device_name(d)) {
        ctx.fail(ctx.where(&item), key,
                 "\"" + d + "\" is no device; use \"cpu\", \"cuda\" or \"cuda:N\" (N: the GPU's index)");
        continue;
      }
      (d == "cpu" ? cpu : gpu) = true;
      auto same = d == "cuda" ? "cuda:0" : d;
      if (std::find(seen.begin(), seen.end(), same) != seen.end())
        ctx.fail(ctx.where(&item), key,
                 "\"" + d +
                     "\" is listed twice; list each device once (a trainer puts one replica on each; "
                     "rollout workers take them in turn, so raise rl.rollout_workers to run several on one)");
      seen.push_back(same);
    }
    if (cpu && gpu)
      ctx.fail(at, key,
               "mixes the CPU with GPUs; a node's replicas and workers are on one kind of device: list GPUs only");
    bool trainer = false, rollout = false;
    if (auto* roles = (*t)["roles"].as_array())
      for (auto& r : *roles) {
        trainer = trainer || r.value<std::string>() == "trainer";
        rollout = rollout || r.value<std::string>() == "rollout";
      }
    auto count = static_cast<int64_t>(list->size());
    if (!trainer && !rollout)
      ctx.fail(at, key,
               "this node has neither the \"trainer\" nor the \"rollout\" role, so nothing would run on its devices; "
               "remove devices (model.device places what else computes)");
    else if (!trainer && workers < count)
      ctx.fail(at, key,
               std::to_string(count) + " devices and rl.rollout_workers = " + std::to_string(workers) + ": " +
                   std::to_string(count - workers) + " of them would run nothing; set rl.rollout_workers = " +
                   std::to_string(count) + " (a multiple runs several on each), or list " + std::to_string(workers));
  }

  // One node trains: the controller's, or a node of its own.
  std::vector<std::string> trainers;
  for (size_t i = 0; ctx.errors.empty() && i < nodes->size(); ++i) {
    auto* t = (*nodes)[i].as_table();
    auto* roles = t ? (*t)["roles"].as_array() : nullptr;
    if (!roles)
      continue;
    for (auto& r : *roles)
      if (r.value<std::string>() == "trainer")
        trainers.push_back("nodes[" + std::to_string(i) + "]");
  }
  if (ctx.errors.empty() && rl_run && trainers.size() != 1)
    ctx.fail(ctx.where(nodes), "nodes",
             trainers.empty()
                 ? "an RL run needs one node with the role \"trainer\" (the controller's, or one of its own)"
                 : "the role \"trainer\" is on " + std::to_string(trainers.size()) +
                       " nodes; one node trains: keep it on one of " + trainers.front() + " and " + trainers.back());
}

}  // namespace areal::config_checks
