// Configuration: every validation error names the file, line:column and key
// path; --set overrides any key; defaults are filled in; node selection.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "areal/runtime/cli.hpp"
#include "areal/runtime/config.hpp"
#include "areal/runtime/failpoints.hpp"

using namespace areal;

namespace {

const char* two_nodes = R"([run]
name = "t"

[cluster]
app_id = "test"

[[nodes]]
name = "head"
port = 7100
roles = ["controller", "trainer"]

[[nodes]]
name = "worker"
port = 7101
roles = ["rollout", "reward"]
)";

// The single error of loading `text`, which must fail.
std::string only_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  auto r = parse_config(text, "topo.toml", overrides);
  REQUIRE_FALSE(r.config);
  REQUIRE_MESSAGE(r.errors.size() == 1, r.errors.size() << " errors, first: " << (r.errors.empty() ? "" : r.errors[0]));
  return r.errors.front();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a valid topology loads with defaults filled in") {
  auto r = parse_config(two_nodes, "topo.toml");
  REQUIRE_MESSAGE(r.config, (r.errors.empty() ? "" : r.errors[0]));
  auto& c = *r.config;
  CHECK(c.run.name == "t");
  CHECK(c.run.output_dir == "runs");
  CHECK(c.cluster.app_id == "test");
  CHECK(c.cluster.heartbeat_interval_ms == 500);
  CHECK(c.cluster.connection_timeout_ms == 3000);
  REQUIRE(c.nodes.size() == 2);
  CHECK(c.nodes[0].host == "127.0.0.1");
  CHECK(c.nodes[1].compute_threads == 1);
  CHECK(c.controller_node().name == "head");
  CHECK(c.nodes[1].has(role::reward));
  CHECK_FALSE(c.nodes[1].has(role::trainer));
}

TEST_CASE("the resolved configuration reloads to the same configuration") {
  auto first =
      parse_config(two_nodes, "topo.toml", {"run.job=probe", "run.hold_s=2", "nodes.worker.compute_threads=3"});
  REQUIRE(first.config);
  auto second = parse_config(first.config->resolved_toml, "resolved.toml");
  REQUIRE_MESSAGE(second.config, (second.errors.empty() ? "" : second.errors[0]));
  CHECK(second.config->run.hold_s == 2.0);
  CHECK(second.config->nodes[1].compute_threads == 3);
  // The resolved text is a fixed point.
  auto third = parse_config(second.config->resolved_toml, "resolved.toml");
  CHECK(second.config->resolved_toml.substr(second.config->resolved_toml.find('\n')) ==
        third.config->resolved_toml.substr(third.config->resolved_toml.find('\n')));
}

TEST_CASE("an override naming an array entry past any index is an error, not a crash") {
  // Found by fuzzing (tests/fuzz/corpus/config/regression_huge_index): std::stoul threw.
  for (auto index : {"99999999999999999999999", "2", "1000000000"}) {
    auto r = parse_config(two_nodes, "topo.toml", {std::string{"nodes["} + index + "].port=1"});
    REQUIRE(r.errors.size() == 1);
    CHECK(contains(r.errors[0], std::string{"no entry '"} + index + "' in 'nodes' (it has 2 entries"));
  }
}

TEST_CASE("unknown key names file and line and column and key path and the valid keys") {
  std::string text = two_nodes;
  text.insert(text.find("[cluster]") + 10, "heartbeat_ms = 5\n");
  auto e = only_error(text);
  CHECK(contains(e, "topo.toml:5:1: cluster.heartbeat_ms: unknown key"));
  CHECK(contains(e, "heartbeat_interval_ms"));
}

TEST_CASE("unknown key inside an array of tables") {
  std::string text = two_nodes;
  text += "gpus = 2\n";
  auto e = only_error(text);
  CHECK(contains(e, "topo.toml:16:1: nodes[1].gpus: unknown key"));
}

TEST_CASE("unknown section") {
  auto e = only_error(std::string{two_nodes} + "\n[trianer]\nlr = 1\n");
  CHECK(contains(e, "topo.toml:17:2: trianer: unknown section"));
}

TEST_CASE("wrong type") {
  std::string text = two_nodes;
  text.replace(text.find("port = 7101"), 11, "port = \"7101\"");
  auto e = only_error(text);
  CHECK(contains(e, "topo.toml:14:8: nodes[1].port: expected an integer, got a string"));
}

TEST_CASE("missing required key") {
  std::string text = two_nodes;
  text.erase(text.find("name = \"worker\"\n"), 16);
  auto e = only_error(text);
  CHECK(contains(e, "topo.toml:12:1: nodes[1].name: missing required key"));  // at the [[nodes]] header
}

TEST_CASE("missing nodes section") {
  auto e = only_error("[run]\nname = \"x\"\n");
  CHECK(contains(e, "topo.toml: nodes: missing; add at least one [[nodes]] entry"));
}

TEST_CASE("out-of-range value") {
  std::string text = two_nodes;
  text.replace(text.find("port = 7100"), 11, "port = 70000");
  auto e = only_error(text);
  CHECK(contains(e, "topo.toml:9:8: nodes[0].port: value 70000 is out of range; use a value in [0, 65535]"));
}

TEST_CASE("duplicate node name names both places") {
  std::string text = two_nodes;
  text.replace(text.find("name = \"worker\""), 15, "name = \"head\"");
  auto e = only_error(text);
  CHECK(contains(e, "topo.toml:13:8: nodes[1].name: duplicate node name \"head\" (first defined at topo.toml:8:8)"));
}

TEST_CASE("port clash on one host") {
  std::string text = two_nodes;
  text.replace(text.find("port = 7101"), 11, "port = 7100");
  auto e = only_error(text);
  CHECK(contains(
      e, "topo.toml:14:8: nodes[1].port: port clash: 127.0.0.1:7100 is already used by the node at topo.toml:9:8"));
}

TEST_CASE("the same port on different hosts is fine") {
  std::string text = two_nodes;
  text.replace(text.find("port = 7101"), 11, "port = 7100\nhost = \"10.0.0.2\"");
  CHECK(parse_config(text, "topo.toml").config);
}

TEST_CASE("unknown role and repeated role and controller count") {
  std::string text = two_nodes;
  text.replace(text.find("\"reward\""), 8, "\"rewarder\"");
  auto e = only_error(text);
  CHECK(contains(e, "topo.toml:15:21: nodes[1].roles: unknown value \"rewarder\"; use one of: controller, trainer"));

  text = two_nodes;
  text.replace(text.find("\"reward\""), 8, "\"rollout\"");
  CHECK(contains(only_error(text), "nodes[1].roles: role \"rollout\" is listed twice"));

  text = two_nodes;
  text.replace(text.find("\"reward\""), 8, "\"controller\"");
  CHECK(contains(only_error(text), "2 nodes have the role \"controller\"; exactly one node must host the controller"));
}

TEST_CASE("a multi-node topology needs listening ports") {
  std::string text = two_nodes;
  text.erase(text.find("port = 7101\n"), 12);
  CHECK(contains(only_error(text), "nodes[1].port: a topology of several nodes needs every node to listen"));
}

TEST_CASE("connection timeout must exceed the heartbeat interval") {
  auto e = only_error(two_nodes, {"cluster.connection_timeout_ms=400"});
  CHECK(contains(e, "--set cluster.connection_timeout_ms=400: cluster.connection_timeout_ms: must exceed"));
}

TEST_CASE("a run name stays inside run.output_dir") {
  for (auto name : {"..", ".", "../elsewhere", "sweep/../../x", "/tmp/x", "a//b", "./a"}) {
    CAPTURE(name);
    auto e = only_error(two_nodes, {std::string{"run.name=\""} + name + "\""});
    CHECK(contains(e, "run.name: \"" + std::string{name} + "\" is not a name inside run.output_dir"));
  }
  for (auto name : {"demo", "sweep/lr1", "v1.2", "..hidden", "a..b"}) {
    CAPTURE(name);
    auto r = parse_config(two_nodes, "topo.toml", {std::string{"run.name=\""} + name + "\""});
    REQUIRE(r.config);
    CHECK(r.config->run.name == name);
  }
}

TEST_CASE("TOML syntax errors give the position") {
  auto e = only_error("[run]\nname = \"x\n");
  CHECK(contains(e, "topo.toml:2:"));
  CHECK(contains(e, "TOML syntax error"));
}

TEST_CASE("several errors are all reported") {
  std::string text = two_nodes;
  text.replace(text.find("port = 7100"), 11, "port = -1");
  text.replace(text.find("app_id = \"test\""), 15, "app_id = 5");
  auto r = parse_config(text, "topo.toml");
  REQUIRE_FALSE(r.config);
  CHECK(r.errors.size() == 2);
}

TEST_CASE("--set overrides any key by index or by node name") {
  auto r = parse_config(two_nodes, "topo.toml",
                        {"run.name=demo", "run.seed=9", "cluster.connect_timeout_s=5", "nodes[0].port=7200",
                         "nodes.worker.roles=[\"rollout\"]", "run.job=probe", "run.hold_s=1.5"});
  REQUIRE_MESSAGE(r.config, (r.errors.empty() ? "" : r.errors[0]));
  CHECK(r.config->run.name == "demo");
  CHECK(r.config->run.seed == 9);
  CHECK(r.config->cluster.connect_timeout_s == 5.0);
  CHECK(r.config->nodes[0].port == 7200);
  CHECK(r.config->nodes[1].roles == std::vector<role>{role::rollout});
  CHECK(r.config->run.hold_s == 1.5);
  CHECK(contains(r.config->resolved_toml, "name = 'demo'"));
}

TEST_CASE("bad --set values are reported against the command line") {
  CHECK(contains(only_error(two_nodes, {"run.seed=abc"}),
                 "--set run.seed=abc: run.seed: expected an integer, got a string"));
  CHECK(contains(only_error(two_nodes, {"nodes.nobody.port=1"}),
                 "--set nodes.nobody.port=1: no entry 'nobody' in 'nodes'"));
  CHECK(contains(only_error(two_nodes, {"cluster.typo=1"}), "--set cluster.typo=1: cluster.typo: unknown key"));
  CHECK(contains(only_error(two_nodes, {"novalue"}), "--set novalue: expected KEY=VALUE"));
  CHECK(contains(only_error(two_nodes, {"run.name.x=1"}), "'name' is a string, not a table"));
  // An array's entry too, not a position in the file (the value's own text is not the file's).
  CHECK(contains(only_error(two_nodes, {"nodes.head.devices=[\"cpu\", \"gpu\"]"}),
                 "--set nodes.head.devices=[\"cpu\", \"gpu\"]: nodes[0].devices: \"gpu\" is no device"));
  CHECK(contains(only_error(two_nodes, {"nodes.head.devices=[\"cpu\", \"cpu\"]"}),
                 "--set nodes.head.devices=[\"cpu\", \"cpu\"]: nodes[0].devices: \"cpu\" is listed twice"));
}

TEST_CASE("a node's devices are spelled as LibTorch names them, of one kind, each once, and every one used") {
  auto r = parse_config(two_nodes, "topo.toml",
                        {"nodes.head.devices=[\"cuda:0\", \"cuda:1\"]", "nodes.worker.devices=[\"cuda:2\", \"cuda:3\"]",
                         "rl.rollout_workers=4"});
  REQUIRE_MESSAGE(r.config, (r.errors.empty() ? "" : r.errors[0]));
  CHECK(r.config->nodes[0].devices == std::vector<std::string>{"cuda:0", "cuda:1"});
  CHECK(r.config->nodes[1].devices == std::vector<std::string>{"cuda:2", "cuda:3"});
  auto reloaded = parse_config(r.config->resolved_toml, "resolved.toml");
  REQUIRE(reloaded.config);
  CHECK(reloaded.config->nodes[1].devices == r.config->nodes[1].devices);
  // Unset: empty (model.device), and the resolved configuration says so and reloads.
  auto plain = parse_config(two_nodes, "topo.toml");
  REQUIRE(plain.config);
  CHECK(plain.config->nodes[0].devices.empty());
  CHECK(parse_config(plain.config->resolved_toml, "resolved.toml").config);

  CHECK(contains(only_error(two_nodes, {"nodes.head.devices=[\"gpu0\"]"}),
                 "nodes[0].devices: \"gpu0\" is no device; use \"cpu\", \"cuda\" or \"cuda:N\""));
  CHECK(contains(only_error(two_nodes, {"nodes.head.devices=[\"cuda\", \"cuda:0\"]"}),
                 "nodes[0].devices: \"cuda:0\" is listed twice"));
  CHECK(contains(only_error(two_nodes, {"nodes.head.devices=[\"cpu\", \"cuda:0\"]"}),
                 "nodes[0].devices: mixes the CPU with GPUs"));
  CHECK(contains(only_error(two_nodes, {"nodes.head.devices=[1]"}), "expected strings only, got an integer"));
  // Every device runs something: a rollout node needs a worker for each.
  CHECK(contains(only_error(two_nodes, {"nodes.worker.devices=[\"cuda:0\", \"cuda:1\", \"cuda:2\"]"}),
                 "nodes[1].devices: 3 devices and rl.rollout_workers = 1: 2 of them would run nothing; set "
                 "rl.rollout_workers = 3"));
  CHECK(parse_config(two_nodes, "topo.toml", {"nodes.worker.devices=[\"cuda:0\", \"cuda:1\"]", "rl.rollout_workers=4"})
            .config);
  auto reward_only = std::string{two_nodes} + R"(
[[nodes]]
name = "scorer"
port = 7102
roles = ["reward"]
devices = ["cuda:0"]
)";
  CHECK(contains(only_error(reward_only),
                 "nodes[2].devices: this node has neither the \"trainer\" nor the \"rollout\" role"));
}

TEST_CASE("the model section has defaults and checks its choices") {
  auto r = parse_config(two_nodes, "topo.toml");
  REQUIRE(r.config);
  CHECK(r.config->model.preset == "tiny");
  CHECK(r.config->model.path.empty());
  CHECK(r.config->model.device == "cpu");
  CHECK(r.config->model.dtype == "float32");
  CHECK(contains(only_error(two_nodes, {"model.dtype=int4"}),
                 "model.dtype: unknown value \"int4\"; use one of: float32, bfloat16, float16"));
  auto custom = parse_config(two_nodes, "topo.toml", {"model.path=/models/qwen2"});
  REQUIRE(custom.config);
  CHECK(custom.config->model.path == "/models/qwen2");
  // A device is spelled as LibTorch names it; whether this build has it is checked at the start.
  CHECK(contains(only_error(two_nodes, {"model.device=gpu0"}),
                 "--set model.device=gpu0: model.device: \"gpu0\" is no device; use \"cpu\", \"cuda\" or \"cuda:N\""));
  CHECK(contains(only_error(two_nodes, {"model.device=cuda:x"}), "is no device"));
  auto gpu = parse_config(two_nodes, "topo.toml", {"model.device=cuda:1"});
  REQUIRE(gpu.config);
  CHECK(gpu.config->model.device == "cuda:1");
  // What this build cannot do is refused with the reason, never accepted and ignored.
  CHECK(contains(only_error(two_nodes, {"model.dtype=float16"}), "CPU autocast has no float16 kernels"));
  auto bf16 = parse_config(two_nodes, "topo.toml", {"model.dtype=bfloat16"});
  REQUIRE(bf16.config);
  CHECK(bf16.config->model.dtype == "bfloat16");
}

TEST_CASE("a missing file is a clear error") {
  auto r = load_config("/nonexistent/areal.toml");
  REQUIRE(r.errors.size() == 1);
  CHECK(contains(r.errors[0], "/nonexistent/areal.toml: cannot open the configuration file"));
}

TEST_CASE("the shipped configurations are valid") {
  // Every one in configs/, so that a new one is checked from the start.
  size_t checked = 0;
  for (auto& entry : std::filesystem::directory_iterator(std::string{AREAL_SOURCE_DIR} + "/configs")) {
    if (entry.path().extension() != ".toml")
      continue;
    auto r = load_config(entry.path().string());
    CHECK_MESSAGE(r.config, entry.path().filename().string() << ": " << (r.errors.empty() ? "" : r.errors[0]));
    ++checked;
  }
  CHECK(checked >= 7);
}

TEST_CASE("command line parsing") {
  const char* ok[] = {"areal",          "--config", "x.toml",     "--node=worker",     "--role",
                      "rollout,reward", "--set",    "run.seed=3", "--set=run.name=a=b"};
  auto r = parse_cli(9, ok);
  REQUIRE(r.options);
  CHECK(r.options->config_path == "x.toml");
  CHECK(*r.options->node == "worker");
  CHECK(*r.options->roles == std::vector<role>{role::rollout, role::reward});
  CHECK(r.options->overrides == std::vector<std::string>{"run.seed=3", "run.name=a=b"});

  const char* bad_role[] = {"areal", "--config", "x.toml", "--role", "rollout,gpu"};
  CHECK(contains(parse_cli(5, bad_role).error, "unknown role \"gpu\""));
  const char* no_config[] = {"areal"};
  CHECK(contains(parse_cli(1, no_config).error, "missing --config FILE"));
  const char* unknown[] = {"areal", "--config", "x", "--frobnicate"};
  CHECK(contains(parse_cli(4, unknown).error, "unknown argument \"--frobnicate\""));
  const char* dangling[] = {"areal", "--config"};
  CHECK(contains(parse_cli(2, dangling).error, "--config needs a file path"));
  const char* simulate[] = {"areal", "simulate", "--config", "x.toml"};
  REQUIRE(parse_cli(4, simulate).options);
  CHECK(parse_cli(4, simulate).options->simulate);
  const char* late[] = {"areal", "--config", "x.toml", "simulate"};
  CHECK(contains(parse_cli(4, late).error, "unknown argument \"simulate\""));  // a command: the first word only
  CHECK_FALSE(r.options->simulate);
}

TEST_CASE("choosing this process's node") {
  auto config = *parse_config(two_nodes, "topo.toml").config;
  cli_options o;
  CHECK(contains(choose_node(config, o).error, "has 2 nodes; pass --node NAME (one of: head, worker)"));
  o.node = "worker";
  CHECK(choose_node(config, o).node->name == "worker");
  o.node = "nobody";
  CHECK(contains(choose_node(config, o).error, "--node nobody: no such node"));
  o.node.reset();
  o.roles = std::vector<role>{role::reward, role::rollout};
  CHECK(choose_node(config, o).node->name == "worker");
  o.node = "worker";
  o.roles = std::vector<role>{role::rollout};
  CHECK(choose_node(config, o).node->roles == std::vector<role>{role::rollout});
  o.roles = std::vector<role>{role::controller};
  CHECK(contains(choose_node(config, o).error, "the controller role is fixed by the topology"));
}

TEST_CASE("every key fills its member, and the defaults are the configuration's own") {
  // Defaults: what a default-constructed run_config holds (config.hpp), for every key left out.
  auto r = parse_config(two_nodes, "topo.toml");
  REQUIRE(r.config);
  run_config defaults;
  CHECK(r.config->rl.eta == defaults.rl.eta);
  CHECK(r.config->rl.checkpoint_every == defaults.rl.checkpoint_every);
  CHECK(r.config->reward.python == defaults.reward.python);
  CHECK(r.config->cluster.weight_chunk_bytes == defaults.cluster.weight_chunk_bytes);
  CHECK(r.config->nodes[0].compute_threads == node_spec{}.compute_threads);
  CHECK(r.config->nodes[0].host == node_spec{}.host);
  // Keys set: each lands in its member.
  auto s = parse_config(two_nodes, "topo.toml",
                        {"rl.top_k=5", "rl.top_p=0.9", "rl.dual_clip=3.0", "rl.behaviour_mode=clamp", "rl.kl_coef=0.1",
                         "rl.kl_estimator=k1", "rl.reward_bias=-0.5", "rl.reward_scale=2.0", "rl.reward_clip=1.0",
                         "rl.overlong_buffer=16", "rl.overlong_factor=0.5", "rl.mode=sync",
                         "cluster.weight_chunk_kb=128", "cluster.security=plain", "task.train_path=-", "run.job=probe",
                         "rl.interruption=keep_cache", "rl.prompt_pool_tokens=1000"});
  REQUIRE_MESSAGE(s.config, (s.errors.empty() ? "" : s.errors.front()));
  auto& rl = s.config->rl;
  CHECK(rl.top_k == 5);
  CHECK(rl.top_p == doctest::Approx(0.9));
  CHECK(rl.dual_clip == 3.0);
  CHECK(rl.behaviour_clamp);
  CHECK(rl.kl_coef == doctest::Approx(0.1));
  CHECK(rl.kl_estimator == "k1");
  CHECK(rl.reward_bias == -0.5);
  CHECK(rl.reward_scale == 2.0);
  CHECK(rl.reward_clip == 1.0);
  CHECK(rl.overlong_buffer == 16);
  CHECK(rl.overlong_factor == 0.5);
  CHECK(rl.synchronous);
  CHECK(rl.interruption == "keep_cache");
  CHECK(rl.prompt_pool_tokens == 1000);
  CHECK(contains(only_error(two_nodes, {"rl.prompt_pool_tokens=-1"}), "rl.prompt_pool_tokens"));
  CHECK(contains(only_error(two_nodes, {"rl.interruption=drop"}), "rl.interruption"));
  CHECK(s.config->cluster.weight_chunk_bytes == 128u * 1024);
  CHECK(!s.config->cluster.tls);
  CHECK(s.config->task.train_path.empty());
  CHECK(s.config->run.probe_only);
  // Values no setting can mean are refused with the reason.
  CHECK(contains(only_error(two_nodes, {"rl.dual_clip=0.5"}), "rl.dual_clip: 0.5 is no dual clip"));
  CHECK(contains(only_error(two_nodes, {"rl.overlong_buffer=500"}), "exceeds rl.max_new_tokens"));
  CHECK(contains(only_error(two_nodes, {"rl.group_size=1", "rl.batch_size=8"}),
                 "rl.group_size: 1: every advantage estimator here"));
  CHECK(parse_config(two_nodes, "topo.toml", {"rl.group_size=1", "rl.batch_size=8", "run.job=probe"}).config);
  CHECK(contains(only_error(two_nodes, {"task.train_path=data.jsonl"}),
                 "task.train_path: is read only by kind = \"jsonl\""));
  CHECK(parse_config(two_nodes, "topo.toml", {"task.kind=jsonl", "task.train_path=data.jsonl"}).config);
  // The probe's own keys: hold_s holds a probe up, and a probe needs nodes to connect.
  CHECK(contains(only_error(two_nodes, {"run.hold_s=5"}), "run.hold_s: 5: only the probe job"));
  CHECK(parse_config(two_nodes, "topo.toml", {"run.hold_s=5", "run.job=probe"}).config);
  std::string one_node =
      "[run]\nname = \"t\"\n[[nodes]]\nname = \"local\"\n"
      "roles = [\"controller\", \"trainer\", \"rollout\", \"reward\"]\n";
  REQUIRE(parse_config(one_node, "topo.toml").config);
  CHECK(contains(only_error(one_node, {"run.job=probe"}), "run.job: \"probe\" checks the connections"));
}

TEST_CASE("roles mean what they say: one node trains, the controller's or one of its own") {
  std::string text = two_nodes;
  text.replace(text.find("[\"controller\", \"trainer\"]"), 25, "[\"controller\"]");
  CHECK(contains(only_error(text), "nodes: an RL run needs one node with the role \"trainer\""));
  // The trainer on the other node: accepted (it trains there).
  std::string moved = text;
  moved.replace(moved.find("[\"rollout\", \"reward\"]"), 21, "[\"rollout\", \"trainer\"]");
  CHECK(parse_config(moved, "topo.toml").config);
  // On both: refused.
  text = two_nodes;
  text.replace(text.find("[\"rollout\", \"reward\"]"), 21, "[\"rollout\", \"trainer\"]");
  CHECK(contains(only_error(text), "the role \"trainer\" is on 2 nodes"));
  // A probe job trains nothing: a controller alone is fine there.
  text = two_nodes;
  text.replace(text.find("[\"controller\", \"trainer\"]"), 25, "[\"controller\"]");
  CHECK(parse_config(text, "topo.toml", {"run.job=probe"}).config);
}

TEST_CASE("failpoints are off unless named, fire at their probability, and a wrong spec is refused whole") {
  namespace fp = areal::failpoints;
  REQUIRE(fp::configure("", 1).empty());
  CHECK(fp::describe_active().empty());
  CHECK_FALSE(fp::fire("reward.verifier_hang"));
  REQUIRE(fp::configure("reward.verifier_hang=1, weights.transfer_cut=0", 1).empty());
  CHECK(fp::describe_active() == "reward.verifier_hang=1, weights.transfer_cut=0");
  int hangs = 0, cuts = 0;
  for (int i = 0; i < 200; ++i) {
    hangs += fp::fire("reward.verifier_hang");
    cuts += fp::fire("weights.transfer_cut");
  }
  CHECK(hangs == 200);
  CHECK(cuts == 0);
  REQUIRE(fp::configure("weights.transfer_cut=0.25", 7).empty());
  for (int i = 0; i < 4000; ++i)
    cuts += fp::fire("weights.transfer_cut");
  CHECK(cuts > 800);  // 1000 expected; the bounds are ten standard deviations wide
  CHECK(cuts < 1200);
  CHECK_FALSE(fp::fire("reward.verifier_hang"));  // replaced, not added to
  // Refused with what to write, and the failpoints on before stay on.
  CHECK(fp::configure("reward.verifier_hnag=0.1", 1) ==
        "AREAL_FAILPOINTS: unknown failpoint \"reward.verifier_hnag\" (known: reward.verifier_hang, "
        "weights.transfer_cut, weights.slow_fetch)");
  CHECK(fp::configure("reward.verifier_hang", 1).find("has no probability") != std::string::npos);
  CHECK(fp::configure("reward.verifier_hang=1.5", 1).find("must be a number in [0, 1]") != std::string::npos);
  CHECK(fp::configure("reward.verifier_hang=0.1x", 1).find("must be a number in [0, 1]") != std::string::npos);
  CHECK(fp::configure("reward.verifier_hang=nan", 1).find("must be a number in [0, 1]") != std::string::npos);
  CHECK(fp::describe_active() == "weights.transfer_cut=0.25");
  REQUIRE(fp::configure("", 1).empty());
}
