// Configuration loading: parse TOML, apply --set overrides, check every key
// against the schema below, fill in defaults, then check the rules that span
// keys (unique node names, port clashes, exactly one controller).
#include "areal/runtime/config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include <toml++/toml.h>

namespace areal {

// -- roles --------------------------------------------------------------------

namespace {
constexpr role all_roles[] = {role::controller, role::trainer, role::rollout, role::reward};
}

const char* to_string(role x) {
  switch (x) {
    case role::controller:
      return "controller";
    case role::trainer:
      return "trainer";
    case role::rollout:
      return "rollout";
    case role::reward:
      return "reward";
  }
  return "unknown";
}

std::optional<role> parse_role(std::string_view name) {
  for (auto r : all_roles)
    if (name == to_string(r))
      return r;
  return std::nullopt;
}

std::optional<std::vector<role>> parse_roles(std::string_view text, std::string* bad) {
  std::vector<role> out;
  while (!text.empty()) {
    auto comma = text.find(',');
    auto item = text.substr(0, comma);
    auto r = parse_role(item);
    if (!r) {
      if (bad)
        *bad = std::string{item};
      return std::nullopt;
    }
    if (std::find(out.begin(), out.end(), *r) == out.end())
      out.push_back(*r);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  if (out.empty()) {
    if (bad)
      *bad = "";
    return std::nullopt;
  }
  return out;
}

std::string join(const std::vector<role>& roles) {
  std::string out;
  for (auto r : roles) {
    if (!out.empty())
      out += ',';
    out += to_string(r);
  }
  return out;
}

bool node_spec::has(role x) const {
  return std::find(roles.begin(), roles.end(), x) != roles.end();
}

const node_spec* run_config::find_node(std::string_view name) const {
  for (auto& n : nodes)
    if (n.name == name)
      return &n;
  return nullptr;
}

const node_spec& run_config::controller_node() const {
  for (auto& n : nodes)
    if (n.has(role::controller))
      return n;
  // Validation guarantees exactly one controller node.
  return nodes.front();
}

// -- the schema ---------------------------------------------------------------

namespace {

enum class kind { boolean, integer, number, string, string_list };

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

using default_value = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<std::string>>;

struct field_spec {
  const char* key;
  kind type;
  default_value fallback;  // monostate: required
  double min = -INFINITY;
  double max = INFINITY;
  std::vector<std::string> one_of = {};  // for strings and string lists
  const char* doc = "";
  bool required() const { return std::holds_alternative<std::monostate>(fallback); }
};

struct section_spec {
  const char* name;
  bool array_of_tables;  // [[name]] entries
  const char* doc;
  std::vector<field_spec> fields;
};

const std::vector<section_spec>& schema() {
  static const std::vector<section_spec> sections = {
      {"run",
       false,
       "What this run is called and where its outputs go.",
       {
           {"name",
            kind::string,
            std::string{"areal-run"},
            -INFINITY,
            INFINITY,
            {},
            "run name; the run directory is output_dir/name"},
           {"output_dir",
            kind::string,
            std::string{"runs"},
            -INFINITY,
            INFINITY,
            {},
            "parent directory of run directories (relative to the working directory)"},
           {"seed", kind::integer, int64_t{1}, 0, 9.007199254740992e15, {}, "seed of every random stream"},
           {"hold_s",
            kind::number,
            0.0,
            0,
            86400,
            {},
            "probe job: seconds the controller keeps the run up after every node joined"},
           {"job",
            kind::string,
            std::string{"rl"},
            -INFINITY,
            INFINITY,
            {"rl", "probe"},
            "rl: the RL run; probe: a connectivity check of the topology (every node joins and exchanges a "
            "trajectory, then the run ends)"},
       }},
      {"cluster",
       false,
       "How the nodes find, authenticate and watch each other.",
       {
           {"app_id",
            kind::string,
            std::string{"areal"},
            -INFINITY,
            INFINITY,
            {},
            "cluster identifier; CAF refuses peers with another one"},
           {"connect_timeout_s",
            kind::number,
            30.0,
            0.1,
            3600,
            {},
            "how long a node retries reaching the controller node before giving up"},
           {"heartbeat_interval_ms",
            kind::integer,
            int64_t{500},
            10,
            60000,
            {},
            "interval of the middleman's heartbeats"},
           {"connection_timeout_ms",
            kind::integer,
            int64_t{3000},
            100,
            600000,
            {},
            "a peer silent this long is declared lost (must exceed heartbeat_interval_ms)"},
           {"security",
            kind::string,
            std::string{"tls"},
            -INFINITY,
            INFINITY,
            {"tls", "plain"},
            "tls: nodes authenticate each other with certificates from certs_dir (mutual TLS); plain: no "
            "authentication or encryption (say so explicitly; for loopback tests)"},
           {"certs_dir",
            kind::string,
            std::string{"certs"},
            -INFINITY,
            INFINITY,
            {},
            "directory of ca.pem and NODE.pem / NODE.key (areal --config T --make-certs writes them)"},
           {"weight_transport",
            kind::string,
            std::string{"gloo"},
            -INFINITY,
            INFINITY,
            {"gloo", "caf", "nccl"},
            "how new weights reach rollout nodes: gloo (a c10d Gloo link per node), nccl (a two-rank NCCL "
            "communicator per node; GPU builds) or caf (chunk messages)"},
           {"weight_chunk_kb",
            kind::integer,
            int64_t{4096},
            64,
            1048576,
            {},
            "weights travel in chunks of this size, each with its own checksum"},
           {"transfer_timeout_ms",
            kind::integer,
            int64_t{60000},
            100,
            3600000,
            {},
            "deadline of one weight transfer to one node"},
           {"request_timeout_s",
            kind::number,
            600.0,
            1,
            86400,
            {},
            "deadline of one generation or reward request; a sample whose request fails is generated again"},
       }},
      {"model",
       false,
       "The policy model: a preset or a Hugging Face directory, and where it runs.",
       {
           {"preset",
            kind::string,
            std::string{"tiny"},
            -INFINITY,
            INFINITY,
            {"micro", "tiny", "small"},
            "model shape when no path is given (micro: about 0.1 M parameters, tiny: about 3 M, small: about 25 M)"},
           {"path",
            kind::string,
            std::string{"-"},
            -INFINITY,
            INFINITY,
            {},
            "Hugging Face model directory to load, or - for a fresh preset"},
           {"device",
            kind::string,
            std::string{"cpu"},
            -INFINITY,
            INFINITY,
            {},
            "cpu, cuda or cuda:N (cuda needs a LibTorch built with CUDA)"},
           {"dtype",
            kind::string,
            std::string{"float32"},
            -INFINITY,
            INFINITY,
            {"float32", "bfloat16", "float16"},
            "parameter and activation type"},
       }},
      {"reward",
       false,
       "The reward service: verification workers and the code sandbox.",
       {
           {"workers", kind::integer, int64_t{2}, 1, 256, {}, "parallel verification workers (one thread each)"},
           {"queue_capacity",
            kind::integer,
            int64_t{64},
            1,
            1e6,
            {},
            "verifications accepted at once (queued + running); more are refused: back-pressure"},
           {"timeout_s",
            kind::number,
            30.0,
            0.1,
            3600,
            {},
            "deadline of one verification; past it the verdict is timeout"},
           {"python",
            kind::string,
            std::string{"/usr/bin/python3"},
            -INFINITY,
            INFINITY,
            {},
            "interpreter for code tasks (absolute path, readable by the sandbox user)"},
           {"sandbox_user",
            kind::string,
            std::string{"nobody"},
            -INFINITY,
            INFINITY,
            {},
            "unprivileged user that runs sandboxed programs when areal runs as root"},
           {"memory_mb", kind::integer, int64_t{1024}, 16, 65536, {}, "address-space limit of a sandboxed program"},
           {"output_kb",
            kind::integer,
            int64_t{1024},
            1,
            1048576,
            {},
            "stdout + stderr kept from a sandboxed program; writing more ends it"},
           {"math_relative_tolerance", kind::number, 1e-4, 0, 1, {}, "tolerance for math answers written as decimals"},
           {"countdown_use_all_numbers",
            kind::boolean,
            false,
            -INFINITY,
            INFINITY,
            {},
            "countdown answers must use every given number"},
       }},
      {"task",
       false,
       "The training and evaluation prompts: a seeded generator or JSONL files.",
       {
           {"kind",
            kind::string,
            std::string{"running_sums"},
            -INFINITY,
            INFINITY,
            {"running_sums", "jsonl"},
            "running_sums: the built-in generator; jsonl: train_path and eval_path"},
           {"train_path",
            kind::string,
            std::string{"-"},
            -INFINITY,
            INFINITY,
            {},
            "JSONL training prompts (kind jsonl)"},
           {"eval_path",
            kind::string,
            std::string{"-"},
            -INFINITY,
            INFINITY,
            {},
            "JSONL held-out prompts (kind jsonl; - : the first eval.prompts training items are held out)"},
           {"max_value", kind::integer, int64_t{9}, 1, 1e6, {}, "running sums: largest term"},
           {"median_terms", kind::number, 3.0, 2, 64, {}, "running sums: median number of terms (log-normal)"},
           {"max_terms", kind::integer, int64_t{8}, 2, 64, {}, "running sums: most terms"},
           {"truncated_fraction",
            kind::number,
            0.0,
            0,
            1,
            {},
            "running sums: share of SFT demonstrations that stop one partial sum short (RL teaches to finish)"},
       }},
      {"sft",
       false,
       "The supervised warm start on worked solutions, before RL.",
       {
           {"steps", kind::integer, int64_t{400}, 0, 1e7, {}, "optimizer steps (0: no warm start)"},
           {"batch_size", kind::integer, int64_t{32}, 1, 1e5, {}, "demonstrations per step"},
           {"lr", kind::number, 2e-3, 0, 1, {}, "peak learning rate (cosine decay to a tenth)"},
           {"warmup_steps", kind::integer, int64_t{20}, 0, 1e7, {}, "linear warmup steps"},
       }},
      {"rl",
       false,
       "Reinforcement learning: the pipeline, the staleness bound and the decoupled PPO objective.",
       {
           {"mode",
            kind::string,
            std::string{"async"},
            -INFINITY,
            INFINITY,
            {"async", "sync"},
            "async: rollout and trainer run concurrently under eta; sync: they alternate (eta = 0)"},
           {"steps", kind::integer, int64_t{60}, 0, 1e7, {}, "training steps (policy versions) of the run"},
           {"eta", kind::integer, int64_t{2}, 0, 1000, {}, "staleness bound in versions (async mode)"},
           {"group_size", kind::integer, int64_t{8}, 1, 4096, {}, "samples per prompt (one group)"},
           {"batch_size",
            kind::integer,
            int64_t{64},
            1,
            1e6,
            {},
            "trajectories per training step; a multiple of group_size"},
           {"max_new_tokens", kind::integer, int64_t{96}, 1, 1e6, {}, "longest response"},
           {"temperature", kind::number, 1.0, 0.01, 100, {}, "sampling temperature (the trainer uses the same)"},
           {"lr", kind::number, 1e-4, 0, 1, {}, "learning rate (constant after warmup)"},
           {"warmup_steps", kind::integer, int64_t{0}, 0, 1e7, {}, "linear warmup steps"},
           {"estimator",
            kind::string,
            std::string{"grpo"},
            -INFINITY,
            INFINITY,
            {"grpo", "dr_grpo", "rloo"},
            "group-relative advantage estimator"},
           {"clip", kind::number, 0.2, 0, 10, {}, "PPO clip range epsilon"},
           {"behaviour_cap",
            kind::number,
            5.0,
            1,
            1e6,
            {},
            "tokens whose importance weight pi_prox/pi_behav exceeds this are masked"},
           {"decoupled",
            kind::boolean,
            true,
            -INFINITY,
            INFINITY,
            {},
            "decoupled PPO (behaviour, proximal, current policy); false: plain PPO anchored at the behaviour policy"},
           {"ppo_minibatches", kind::integer, int64_t{1}, 1, 1024, {}, "optimizer steps per training batch"},
           {"max_tokens_per_mb", kind::integer, int64_t{4096}, 16, 1e9, {}, "token budget of one packed micro-batch"},
           {"rollout_workers", kind::integer, int64_t{1}, 1, 1024, {}, "generation engines on this node"},
           {"rollout_slots", kind::integer, int64_t{64}, 1, 1e5, {}, "sequences one engine decodes together"},
           {"max_concurrent", kind::integer, int64_t{128}, 1, 1e6, {}, "requests in flight over all engines"},
           {"checkpoint_every",
            kind::integer,
            int64_t{20},
            0,
            1e7,
            {},
            "steps between run checkpoints (0: only at the end and on SIGINT)"},
       }},
      {"eval",
       false,
       "Held-out evaluation with greedy decoding.",
       {
           {"prompts", kind::integer, int64_t{256}, 0, 1e7, {}, "held-out prompts (0: no evaluation)"},
           {"every", kind::integer, int64_t{20}, 0, 1e7, {}, "steps between evaluations (0: before and after only)"},
       }},
      {"nodes",
       true,
       "One [[nodes]] entry per process of the topology.",
       {
           {"name", kind::string, {}, -INFINITY, INFINITY, {}, "unique node name, used by --node"},
           {"host",
            kind::string,
            std::string{"127.0.0.1"},
            -INFINITY,
            INFINITY,
            {},
            "address the node listens on and peers connect to"},
           {"port",
            kind::integer,
            int64_t{0},
            0,
            65535,
            {},
            "TCP port (0: no listening; only for a single-node topology)"},
           {"roles",
            kind::string_list,
            {},
            -INFINITY,
            INFINITY,
            {"controller", "trainer", "rollout", "reward"},
            "what the node runs"},
           {"compute_threads", kind::integer, int64_t{1}, 1, 1024, {}, "threads for LibTorch work on this node"},
       }},
  };
  return sections;
}

// -- error reporting ----------------------------------------------------------

struct context {
  std::string source;                                // file name
  std::map<const toml::node*, std::string> origins;  // nodes set from the command line
  std::vector<std::string> errors;

  std::string where(const toml::node* n, const toml::source_region* region = nullptr) const {
    if (n) {
      auto i = origins.find(n);
      if (i != origins.end())
        return i->second;
    }
    const toml::source_region& r = region ? *region : n->source();
    if (r.begin.line == 0)
      return source;
    return source + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
  }

  void fail(std::string location, const std::string& path, const std::string& what) {
    errors.push_back(std::move(location) + ": " + path + ": " + what);
  }
};

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a number";
    case toml::node_type::boolean:
      return "a boolean";
    default:
      return "a date/time";
  }
}

std::string format_number(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

std::string list(const std::vector<std::string>& xs) {
  std::string out;
  for (auto& x : xs)
    out += (out.empty() ? "" : ", ") + x;
  return out;
}

// -- --set overrides ----------------------------------------------------------

// Splits "nodes[1].port" / "nodes.worker.port" into steps.
std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> steps;
  std::string current;
  for (char c : path) {
    if (c == '.' || c == '[' || c == ']') {
      if (!current.empty())
        steps.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty())
    steps.push_back(current);
  return steps;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void apply_override(toml::table& root, const std::string& text, context& ctx) {
  auto eq = text.find('=');
  std::string origin = "--set " + text;
  if (eq == std::string::npos || eq == 0) {
    ctx.errors.push_back(origin + ": expected KEY=VALUE, e.g. --set cluster.connect_timeout_s=10");
    return;
  }
  auto path = text.substr(0, eq);
  auto value_text = text.substr(eq + 1);
  auto steps = split_path(path);
  // The value is TOML when it parses as such, else a bare string (--set run.name=demo).
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value_text);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value_text}};
  }
  if (!parsed.get("v") || parsed.size() != 1)
    parsed = toml::table{{"v", value_text}};

  toml::table* table = &root;
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    auto& step = steps[i];
    auto* child = table->get(step);
    if (!child) {
      table->insert(step, toml::table{});
      child = table->get(step);
    }
    if (auto* arr = child->as_array()) {
      // Next step picks an entry: by index or by its `name`.
      if (i + 2 >= steps.size()) {
        ctx.errors.push_back(origin + ": '" + step + "' is an array of tables; name an entry and a key, e.g. " + step +
                             "[0].KEY or " + step + ".NAME.KEY");
        return;
      }
      auto& pick = steps[++i];
      toml::table* entry = nullptr;
      if (all_digits(pick)) {
        auto index = std::stoul(pick);
        if (index < arr->size())
          entry = (*arr)[index].as_table();
      } else {
        for (auto& e : *arr)
          if (auto* t = e.as_table())
            if (auto name = (*t)["name"].value<std::string>(); name && *name == pick)
              entry = t;
      }
      if (!entry) {
        ctx.errors.push_back(origin + ": no entry '" + pick + "' in '" + step + "' (it has " +
                             std::to_string(arr->size()) + " entries; use an index from 0 or an entry's name)");
        return;
      }
      table = entry;
    } else if (auto* t = child->as_table()) {
      table = t;
    } else {
      ctx.errors.push_back(origin + ": '" + step + "' is " + type_name(*child) + ", not a table");
      return;
    }
  }
  if (steps.empty()) {
    ctx.errors.push_back(origin + ": empty key");
    return;
  }
  table->insert_or_assign(steps.back(), std::move(*parsed.get("v")));
  ctx.origins[table->get(steps.back())] = origin;
}

// -- checking one table against its fields ------------------------------------

void check_table(toml::table& table, const section_spec& section, const std::string& prefix, context& ctx) {
  for (auto&& [key, value] : table) {
    auto known = std::any_of(section.fields.begin(), section.fields.end(),
                             [&](const field_spec& f) { return key.str() == f.key; });
    if (!known) {
      std::vector<std::string> names;
      for (auto& f : section.fields)
        names.emplace_back(f.key);
      ctx.fail(ctx.where(&value, &key.source()), prefix + std::string{key.str()},
               "unknown key; the keys of [" + std::string{section.name} + "] are: " + list(names));
    }
  }
  for (auto& f : section.fields) {
    auto path = prefix + f.key;
    auto* node = table.get(f.key);
    if (!node) {
      if (f.required()) {
        ctx.fail(ctx.where(&table), path, std::string{"missing required key ("} + f.doc + "); add " + f.key + " = ...");
        continue;
      }
      std::visit(
          [&](auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::vector<std::string>>) {
              toml::array arr;
              for (auto& s : x)
                arr.push_back(s);
              table.insert(f.key, std::move(arr));
            } else if constexpr (!std::is_same_v<T, std::monostate>) {
              table.insert(f.key, x);
            }
          },
          f.fallback);
      continue;
    }
    auto wrong_type = [&] {
      ctx.fail(ctx.where(node), path, std::string{"expected "} + to_string(f.type) + ", got " + type_name(*node));
    };
    auto check_range = [&](double x) {
      if (x < f.min || x > f.max || std::isnan(x))
        ctx.fail(ctx.where(node), path,
                 "value " + format_number(x) + " is out of range; use a value in [" + format_number(f.min) + ", " +
                     format_number(f.max) + "]");
    };
    auto check_choice = [&](const std::string& s, const toml::node* at) {
      if (!f.one_of.empty() && std::find(f.one_of.begin(), f.one_of.end(), s) == f.one_of.end())
        ctx.fail(ctx.where(at), path, "unknown value \"" + s + "\"; use one of: " + list(f.one_of));
    };
    switch (f.type) {
      case kind::boolean:
        if (!node->is_boolean())
          wrong_type();
        break;
      case kind::integer:
        if (!node->is_integer())
          wrong_type();
        else
          check_range(static_cast<double>(node->as_integer()->get()));
        break;
      case kind::number:
        if (node->is_integer()) {  // 30 where 30.0 is meant
          auto x = static_cast<double>(node->as_integer()->get());
          table.insert_or_assign(f.key, x);
          auto origin = ctx.origins.find(node);
          node = table.get(f.key);
          if (origin != ctx.origins.end())
            ctx.origins[node] = origin->second;
        }
        if (!node->is_floating_point())
          wrong_type();
        else
          check_range(node->as_floating_point()->get());
        break;
      case kind::string:
        if (!node->is_string())
          wrong_type();
        else if (node->as_string()->get().empty())
          ctx.fail(ctx.where(node), path, "must not be empty");
        else
          check_choice(node->as_string()->get(), node);
        break;
      case kind::string_list:
        if (!node->is_array()) {
          wrong_type();
          break;
        }
        if (node->as_array()->empty())
          ctx.fail(ctx.where(node), path, "must not be empty; use one or more of: " + list(f.one_of));
        for (auto& item : *node->as_array()) {
          if (!item.is_string())
            ctx.fail(ctx.where(&item), path, "expected strings only, got " + type_name(item));
          else
            check_choice(item.as_string()->get(), &item);
        }
        break;
    }
  }
}

// -- the rules that span keys ------------------------------------------------

void check_topology(toml::table& root, context& ctx) {
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
  auto kind = root["task"]["kind"].value<std::string>();
  auto train = root["task"]["train_path"].value<std::string>();
  if (kind && *kind == "jsonl" && train && *train == "-")
    ctx.fail(ctx.where(root["task"]["kind"].node()), "task.kind",
             "jsonl needs task.train_path (a JSONL file of prompts); set it, or use kind = \"running_sums\"");
}

run_config extract(const toml::table& root, const std::string& source) {
  run_config c;
  c.source = source;
  auto run = root["run"];
  c.run.name = run["name"].value_or(std::string{});
  c.run.output_dir = run["output_dir"].value_or(std::string{});
  c.run.seed = static_cast<uint64_t>(run["seed"].value_or(int64_t{0}));
  c.run.hold_s = run["hold_s"].value_or(0.0);
  c.run.probe_only = run["job"].value_or(std::string{"rl"}) == "probe";
  auto cluster = root["cluster"];
  c.cluster.app_id = cluster["app_id"].value_or(std::string{});
  c.cluster.connect_timeout_s = cluster["connect_timeout_s"].value_or(0.0);
  c.cluster.heartbeat_interval_ms = static_cast<uint32_t>(cluster["heartbeat_interval_ms"].value_or(int64_t{0}));
  c.cluster.connection_timeout_ms = static_cast<uint32_t>(cluster["connection_timeout_ms"].value_or(int64_t{0}));
  c.cluster.weight_transport = cluster["weight_transport"].value_or(std::string{"gloo"});
  c.cluster.tls = cluster["security"].value_or(std::string{"tls"}) == "tls";
  c.cluster.certs_dir = cluster["certs_dir"].value_or(std::string{"certs"});
  c.cluster.weight_chunk_bytes = static_cast<uint64_t>(cluster["weight_chunk_kb"].value_or(int64_t{4096})) * 1024;
  c.cluster.transfer_timeout_ms = static_cast<uint32_t>(cluster["transfer_timeout_ms"].value_or(int64_t{60000}));
  c.cluster.request_timeout_s = cluster["request_timeout_s"].value_or(600.0);
  auto model = root["model"];
  c.model.preset = model["preset"].value_or(std::string{});
  c.model.path = model["path"].value_or(std::string{});
  if (c.model.path == "-")
    c.model.path.clear();
  c.model.device = model["device"].value_or(std::string{});
  c.model.dtype = model["dtype"].value_or(std::string{});
  auto reward = root["reward"];
  c.reward.workers = static_cast<uint32_t>(reward["workers"].value_or(int64_t{2}));
  c.reward.queue_capacity = static_cast<uint32_t>(reward["queue_capacity"].value_or(int64_t{64}));
  c.reward.timeout_s = reward["timeout_s"].value_or(30.0);
  c.reward.python = reward["python"].value_or(std::string{});
  c.reward.sandbox_user = reward["sandbox_user"].value_or(std::string{});
  c.reward.memory_mb = static_cast<uint64_t>(reward["memory_mb"].value_or(int64_t{1024}));
  c.reward.output_kb = static_cast<uint64_t>(reward["output_kb"].value_or(int64_t{1024}));
  c.reward.math_relative_tolerance = reward["math_relative_tolerance"].value_or(1e-4);
  c.reward.countdown_use_all_numbers = reward["countdown_use_all_numbers"].value_or(false);
  auto task = root["task"];
  c.task.kind = task["kind"].value_or(std::string{});
  c.task.train_path = task["train_path"].value_or(std::string{});
  c.task.eval_path = task["eval_path"].value_or(std::string{});
  for (auto* path : {&c.task.train_path, &c.task.eval_path})
    if (*path == "-")
      path->clear();
  c.task.max_value = task["max_value"].value_or(int64_t{9});
  c.task.median_terms = task["median_terms"].value_or(3.0);
  c.task.max_terms = task["max_terms"].value_or(int64_t{8});
  c.task.truncated_fraction = task["truncated_fraction"].value_or(0.0);
  auto sft = root["sft"];
  c.sft.steps = sft["steps"].value_or(int64_t{0});
  c.sft.batch_size = sft["batch_size"].value_or(int64_t{32});
  c.sft.lr = sft["lr"].value_or(2e-3);
  c.sft.warmup_steps = sft["warmup_steps"].value_or(int64_t{0});
  auto rl = root["rl"];
  c.rl.synchronous = rl["mode"].value_or(std::string{}) == "sync";
  c.rl.steps = rl["steps"].value_or(int64_t{0});
  c.rl.eta = rl["eta"].value_or(int64_t{0});
  c.rl.group_size = rl["group_size"].value_or(int64_t{1});
  c.rl.batch_size = rl["batch_size"].value_or(int64_t{1});
  c.rl.max_new_tokens = rl["max_new_tokens"].value_or(int64_t{1});
  c.rl.temperature = rl["temperature"].value_or(1.0);
  c.rl.lr = rl["lr"].value_or(0.0);
  c.rl.warmup_steps = rl["warmup_steps"].value_or(int64_t{0});
  c.rl.estimator = rl["estimator"].value_or(std::string{});
  c.rl.clip = rl["clip"].value_or(0.2);
  c.rl.behaviour_cap = rl["behaviour_cap"].value_or(5.0);
  c.rl.decoupled = rl["decoupled"].value_or(true);
  c.rl.ppo_minibatches = rl["ppo_minibatches"].value_or(int64_t{1});
  c.rl.max_tokens_per_mb = rl["max_tokens_per_mb"].value_or(int64_t{4096});
  c.rl.rollout_workers = rl["rollout_workers"].value_or(int64_t{1});
  c.rl.rollout_slots = rl["rollout_slots"].value_or(int64_t{64});
  c.rl.max_concurrent = rl["max_concurrent"].value_or(int64_t{128});
  c.rl.checkpoint_every = rl["checkpoint_every"].value_or(int64_t{0});
  auto eval = root["eval"];
  c.eval.prompts = eval["prompts"].value_or(int64_t{0});
  c.eval.every = eval["every"].value_or(int64_t{0});
  for (auto& entry : *root["nodes"].as_array()) {
    auto& t = *entry.as_table();
    node_spec n;
    n.name = t["name"].value_or(std::string{});
    n.host = t["host"].value_or(std::string{});
    n.port = static_cast<uint16_t>(t["port"].value_or(int64_t{0}));
    for (auto& r : *t["roles"].as_array())
      n.roles.push_back(*parse_role(r.value_or(std::string{})));
    n.compute_threads = static_cast<uint32_t>(t["compute_threads"].value_or(int64_t{1}));
    c.nodes.push_back(std::move(n));
  }
  std::ostringstream os;
  os << "# Resolved configuration of run \"" << c.run.name << "\": read from " << source
     << ", overrides applied, defaults filled in.\n"
     << root << "\n";
  c.resolved_toml = os.str();
  return c;
}

config_result validate(toml::table root, const std::string& source, const std::vector<std::string>& overrides) {
  context ctx;
  ctx.source = source;
  for (auto& o : overrides)
    apply_override(root, o, ctx);
  if (!ctx.errors.empty())
    return {std::nullopt, ctx.errors};
  for (auto&& [key, value] : root) {
    auto& sections = schema();
    if (std::none_of(sections.begin(), sections.end(), [&](auto& s) { return key.str() == s.name; })) {
      std::vector<std::string> names;
      for (auto& s : sections)
        names.emplace_back(s.name);
      ctx.fail(ctx.where(&value, &key.source()), std::string{key.str()},
               "unknown section; the sections are: " + list(names));
    }
  }
  for (auto& section : schema()) {
    std::string name = section.name;
    if (!section.array_of_tables) {
      if (!root.get(name))
        root.insert(name, toml::table{});
      auto* table = root[name].as_table();
      if (!table) {
        ctx.fail(ctx.where(root.get(name)), name, "expected a table [" + name + "], got " + type_name(*root.get(name)));
        continue;
      }
      check_table(*table, section, name + ".", ctx);
      continue;
    }
    auto* node = root.get(name);
    if (!node) {
      ctx.fail(source, name, "missing; add at least one [[" + name + "]] entry (" + section.doc + ")");
      continue;
    }
    auto* arr = node->as_array();
    if (!arr || !arr->is_array_of_tables() || arr->empty()) {
      ctx.fail(ctx.where(node), name, "expected one or more [[" + name + "]] tables, got " + type_name(*node));
      continue;
    }
    for (size_t i = 0; i < arr->size(); ++i)
      check_table(*(*arr)[i].as_table(), section, name + "[" + std::to_string(i) + "].", ctx);
  }
  if (ctx.errors.empty())
    check_topology(root, ctx);
  if (!ctx.errors.empty())
    return {std::nullopt, ctx.errors};
  return {extract(root, source), {}};
}

}  // namespace

config_result parse_config(std::string_view text, const std::string& source_name,
                           const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    auto& b = e.source().begin;
    return {std::nullopt,
            {source_name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
             ": TOML syntax error: " + std::string{e.description()}}};
  }
  return validate(std::move(root), source_name, overrides);
}

config_result load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return {std::nullopt,
            {path +
             ": cannot open the configuration file; pass an existing file with --config (examples are in configs/)"}};
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

std::string describe_config_schema() {
  std::ostringstream os;
  for (auto& s : schema()) {
    os << (s.array_of_tables ? "[[" : "[") << s.name << (s.array_of_tables ? "]]" : "]") << "  # " << s.doc << "\n";
    for (auto& f : s.fields) {
      os << "  " << f.key << " : " << to_string(f.type);
      if (f.required())
        os << ", required";
      std::visit(
          [&](auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::string>)
              os << ", default \"" << x << "\"";
            else if constexpr (std::is_same_v<T, bool>)
              os << ", default " << (x ? "true" : "false");
            else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
              os << ", default " << x;
          },
          f.fallback);
      if (std::isfinite(f.min) || std::isfinite(f.max))
        os << ", in [" << format_number(f.min) << ", " << format_number(f.max) << "]";
      if (!f.one_of.empty())
        os << ", of: " << list(f.one_of);
      os << "\n      " << f.doc << "\n";
    }
  }
  return os.str();
}

}  // namespace areal
