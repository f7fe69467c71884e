// The `areal` binary as users run it: separate processes on loopback that
// connect in either order, exchange trajectories and print each other's
// identity; a SIGKILLed peer is reported; signals and bad input end a node
// cleanly with the documented exit codes. Every wait is bounded.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>

#include "node_process.hpp"

using namespace areal::test;
using namespace std::chrono_literals;

namespace {

std::string topology(uint16_t head_port, uint16_t worker_port, double hold_s = 0, const char* app_id = "areal-test") {
  return "[run]\nname = \"proc\"\njob = \"probe\"\nhold_s = " + std::to_string(hold_s) + "\n\n[cluster]\napp_id = \"" +
         app_id +
         "\"\nsecurity = \"plain\"\nconnect_timeout_s = 20.0\nheartbeat_interval_ms = 200\nconnection_timeout_ms = "
         "1500\n\n"
         "[[nodes]]\nname = \"head\"\nport = " +
         std::to_string(head_port) +
         "\nroles = [\"controller\", \"trainer\"]\n\n[[nodes]]\nname = \"worker\"\nport = " +
         std::to_string(worker_port) + "\nroles = [\"rollout\", \"reward\"]\n";
}

std::string two_free_ports_topology(double hold_s = 0) {
  auto ports = free_ports(2);
  return topology(ports[0], ports[1], hold_s);
}

struct two_nodes {
  scratch_dir dir;
  std::string config;
  explicit two_nodes(const std::string& name, double hold_s = 0)
      : dir(name), config(dir.write("topology.toml", two_free_ports_topology(hold_s))) {}
  std::unique_ptr<node_process> start(const std::string& node, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--config", config, "--node", node};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = std::make_unique<node_process>(args, dir.path / (node + ".log"), dir.path);
    REQUIRE(p->started());
    return p;
  }
};

void check_joined(node_process& head, node_process& worker) {
  CHECK_MESSAGE(head.wait_for("peer joined: worker (roles rollout,reward; pid", 15s), head.log());
  CHECK_MESSAGE(worker.wait_for("peer joined: head (roles controller,trainer; pid", 15s), worker.log());
  CHECK_MESSAGE(head.wait_for("received trajectory of prompt 1 from worker", 15s), head.log());
  CHECK_MESSAGE(worker.wait_for("received trajectory of prompt 1 from head", 15s), worker.log());
  CHECK(head.wait_for("worker acknowledged our trajectory (checksum", 15s));
  CHECK(worker.wait_for("head acknowledged our trajectory (checksum", 15s));
}

}  // namespace

TEST_CASE("areal --version names the weight links this build has") {
  scratch_dir dir{"version"};
  node_process p{{"--version"}, dir.path / "version.log", dir.path};
  REQUIRE(p.wait_exit(30s) == 0);
  auto out = p.log();
  CHECK(out.find("areal ") == 0);
  // Gloo where the build found its headers (actors/CMakeLists.txt, AREAL_GLOO), else said missing.
  if (AREAL_GLOO_LINK)
    CHECK(out.find("weight links: caf, gloo, nccl") != std::string::npos);
  else
    CHECK(out.find("weight links: caf, gloo (not in this build") != std::string::npos);
}

TEST_CASE("two nodes connect worker-first and exchange trajectories and both exit 0") {
  two_nodes t{"worker-first"};
  auto worker = t.start("worker");
  CHECK(worker->wait_for("listening on 127.0.0.1:", 10s));
  std::this_thread::sleep_for(300ms);  // the worker is retrying by now
  auto head = t.start("head");
  check_joined(*head, *worker);
  CHECK(head->wait_exit(15s) == 0);
  CHECK(worker->wait_exit(15s) == 0);
  CHECK(worker->log().find("the controller ended the run") != std::string::npos);
  CHECK(std::filesystem::exists(t.dir.path / "runs/proc/config.toml"));
  CHECK(std::filesystem::exists(t.dir.path / "runs/proc/config.worker.toml"));
}

TEST_CASE("a node that ended a run listens on its port again at once") {
  two_nodes t{"restart"};
  auto head = t.start("head");
  auto worker = t.start("worker");
  check_joined(*head, *worker);
  REQUIRE(head->wait_exit(15s) == 0);
  REQUIRE(worker->wait_exit(15s) == 0);
  // The run's connections to their ports now wait out TIME_WAIT (about a minute) on the side that closed
  // first; the ports themselves are free.
  for (std::string node : {"head", "worker"}) {
    auto again = t.start(node, {"--run-dir", (t.dir.path / ("again-" + node)).string()});
    CHECK_MESSAGE(again->wait_for("listening on 127.0.0.1:", 10s), again->log());
    CHECK(again->log().find("cannot listen") == std::string::npos);
  }
}

TEST_CASE("two nodes connect head-first too with the worker selected by --role") {
  two_nodes t{"head-first"};
  auto head = t.start("head");
  CHECK(head->wait_for("listening on", 10s));
  auto worker =
      std::make_unique<node_process>(std::vector<std::string>{"--config", t.config, "--role", "reward,rollout"},
                                     t.dir.path / "worker.log", t.dir.path);
  check_joined(*head, *worker);
  CHECK(head->wait_exit(15s) == 0);
  CHECK(worker->wait_exit(15s) == 0);
}

TEST_CASE("a SIGKILLed worker is reported as lost within the connection timeout and SIGTERM stops the head") {
  two_nodes t{"sigkill", 600};
  auto head = t.start("head");
  auto worker = t.start("worker");
  REQUIRE(head->wait_for("all 2 node(s) joined", 20s));
  worker->kill(SIGKILL);
  CHECK(worker->wait_exit(5s) == 128 + SIGKILL);
  // Bounded by cluster.connection_timeout_ms (1.5 s) plus scheduling slack.
  CHECK_MESSAGE(head->wait_for("lost peer worker (roles rollout,reward)", 1500ms + 2s), head->log());
  head->kill(SIGTERM);
  CHECK(head->wait_exit(5s) == 0);
  CHECK(head->log().find("received SIGTERM; stopping the node") != std::string::npos);
}

TEST_CASE("a worker that loses the controller stops with exit code 4") {
  two_nodes t{"lost-controller", 600};
  auto head = t.start("head");
  auto worker = t.start("worker");
  REQUIRE(worker->wait_for("head acknowledged our trajectory", 20s));
  head->kill(SIGKILL);
  CHECK_MESSAGE(worker->wait_exit(10s) == 4, worker->log());
  CHECK(worker->log().find("lost the controller node head") != std::string::npos);
}

TEST_CASE("an unreachable controller is a clear error after the connect timeout") {
  two_nodes t{"unreachable"};
  auto worker = t.start("worker", {"--set", "cluster.connect_timeout_s=1"});
  CHECK_MESSAGE(worker->wait_exit(15s) == 3, worker->log());
  CHECK(worker->log().find("could not reach the controller node head at 127.0.0.1:") != std::string::npos);
  CHECK(worker->log().find("Start that node, or check its host and port") != std::string::npos);
}

TEST_CASE("a controller whose nodes never join stops and names them") {
  two_nodes t{"never-joined"};
  auto head = t.start("head", {"--set", "cluster.connect_timeout_s=1"});
  CHECK_MESSAGE(head->wait_exit(15s) == 3, head->log());
  CHECK(head->log().find("node(s) worker did not join within cluster.connect_timeout_s") != std::string::npos);
}

TEST_CASE("a node of another cluster is refused") {
  two_nodes t{"foreign"};
  auto head = t.start("head", {"--set", "run.hold_s=30"});
  REQUIRE(head->wait_for("listening on", 10s));
  auto worker = t.start("worker", {"--set", "cluster.app_id=someone-else"});
  CHECK_MESSAGE(worker->wait_exit(15s) == 5, worker->log());
  CHECK(worker->log().find("belongs to another cluster") != std::string::npos);
  head->kill(SIGINT);
  CHECK(head->wait_exit(5s) == 0);
}

TEST_CASE("the single-node default runs the RL job, SIGINT checkpoints it and --resume finishes it") {
  scratch_dir dir{"single"};
  auto with = [](std::vector<std::string> more) {
    more.insert(more.begin(), {"--set", "rl.checkpoint_every=2"});
    return ci_sized_default(more);
  };
  {
    node_process run(with({"--set", "rl.steps=100000"}), dir.path / "a.log", dir.path);
    REQUIRE_MESSAGE(run.wait_for("checkpoint of version 2 written", 60s), run.log());
    CHECK(run.log().find("BLAS ") != std::string::npos);
    CHECK(run.log().find("held-out greedy accuracy before RL") != std::string::npos);
    run.kill(SIGINT);
    CHECK_MESSAGE(run.wait_exit(20s) == 0, run.log());
    CHECK(run.log().find("stopping at the next step boundary") != std::string::npos);
  }
  auto run_dir = dir.path / "runs" / "single-node";
  CHECK(std::filesystem::exists(run_dir / "checkpoint" / "trainer_state.json"));
  CHECK(std::filesystem::exists(run_dir / "checkpoint" / "controller_state.capnp"));
  CHECK(std::filesystem::exists(run_dir / "trace.json"));
  CHECK(std::filesystem::exists(run_dir / "config.toml"));
  {
    // Past the steps the first run did before the signal reached it (on a fast machine more than ten).
    const std::string last_checkpoint = "checkpoint of version ";
    auto log = read_text(dir.path / "a.log");
    auto at = log.rfind(last_checkpoint);
    REQUIRE(at != std::string::npos);
    auto done = std::stoll(log.substr(at + last_checkpoint.size()));
    node_process resumed(with({"--set", "rl.steps=" + std::to_string(done + 4), "--resume"}), dir.path / "b.log",
                         dir.path);
    CHECK_MESSAGE(resumed.wait_exit(60s) == 0, resumed.log());
    CHECK(resumed.log().find("resuming from") != std::string::npos);
    CHECK(resumed.log().find("run complete") != std::string::npos);
    CHECK(resumed.log().find("held-out accuracy: ") != std::string::npos);
  }
  node_process nothing(with({"--run-dir", (dir.path / "empty").string(), "--resume"}), dir.path / "c.log", dir.path);
  CHECK(nothing.wait_exit(20s) == 2);
  CHECK(nothing.log().find("no checkpoint in") != std::string::npos);
}

TEST_CASE("a node given more compute threads than the CPUs it may use says so at the start") {
  // Bound to one CPU of those this test may use (taskset, from util-linux), with two compute threads.
  cpu_set_t allowed;
  REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &allowed))
    ++first;
  auto bound = [first](int threads) {
    std::vector<std::string> args{"-c", std::to_string(first), AREAL_BINARY};
    for (auto& a : ci_sized_default(
             {"--set", "nodes.local.compute_threads=" + std::to_string(threads), "--set", "rl.steps=1", "--fresh"}))
      args.push_back(a);
    return args;
  };
  scratch_dir dir{"oversubscribed"};
  node_process run(bound(2), dir.path / "out.log", dir.path, "/usr/bin/taskset");
  CHECK_MESSAGE(run.wait_exit(60s) == 0, run.log());
  CHECK_MESSAGE(run.log().find("2 compute thread(s) on 1 usable CPU (") != std::string::npos, run.log());
  CHECK(run.log().find("nodes.local.compute_threads = 2 exceeds this process's 1 usable CPU") != std::string::npos);
  CHECK(run.log().find("set compute_threads to 1 or fewer") != std::string::npos);
  CHECK(run.log().find("run complete") != std::string::npos);  // a warning: the run goes on
  // With one compute thread, no warning.
  node_process fits(bound(1), dir.path / "fits.log", dir.path, "/usr/bin/taskset");
  CHECK_MESSAGE(fits.wait_exit(60s) == 0, fits.log());
  CHECK(fits.log().find("1 compute thread(s) on 1 usable CPU (") != std::string::npos);
  CHECK(fits.log().find("exceeds this process's") == std::string::npos);
}

TEST_CASE("bad configuration exits 2 before starting anything") {
  scratch_dir dir{"badconfig"};
  auto config =
      dir.write("bad.toml", "[run]\nname = \"x\"\nsed = 1\n[[nodes]]\nname = \"a\"\nroles = [\"controller\"]\n");
  node_process node({"--config", config}, dir.path / "out.log", dir.path);
  CHECK(node.wait_exit(10s) == 2);
  CHECK(node.log().find("bad.toml:3:1: run.sed: unknown key") != std::string::npos);
  CHECK(node.log().find("nothing was started") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.path / "runs"));
}

// Only where LibTorch has no CUDA (a case that runs nothing would fail as not found in CTest, tests/CMakeLists.txt).
#ifndef AREAL_TORCH_CUDA
TEST_CASE("a device this LibTorch lacks is refused at the start, saying what to use") {
  scratch_dir dir{"nodevice"};
  // In model.device, and in a node's devices.
  for (std::string set : {"model.device=\"cuda:0\"", "nodes.local.devices=[\"cuda:1\", \"cuda:0\"]"}) {
    INFO(set);
    node_process run(ci_sized_default({"--set", set}), dir.path / "out.log", dir.path);
    CHECK_MESSAGE(run.wait_exit(30s) == 2, run.log());
    CHECK(run.log().find("asked for (model.device, or a node's devices), but this LibTorch build has no CUDA") !=
          std::string::npos);
    CHECK(run.log().find("use \"cpu\"") != std::string::npos);
    CHECK(run.log().find("held-out greedy accuracy") == std::string::npos);  // nothing ran
  }
}
#endif

TEST_CASE("a port in use is reported with what to do") {
  two_nodes t{"port-in-use", 600};
  auto head = t.start("head");
  REQUIRE(head->wait_for("listening on", 10s));
  auto second = std::make_unique<node_process>(
      std::vector<std::string>{"--config", t.config, "--node", "head", "--run-dir", (t.dir.path / "other").string()},
      t.dir.path / "second.log", t.dir.path);
  CHECK_MESSAGE(second->wait_exit(10s) == 2, second->log());
  CHECK(second->log().find("cannot listen on 127.0.0.1:") != std::string::npos);
  head->kill(SIGTERM);
  CHECK_MESSAGE(head->wait_exit(5s) == 0, head->log());
}

namespace {

// Two nodes whose topology asks for mutual TLS; each --make-certs run makes its own CA.
struct tls_pair {
  scratch_dir dir;
  std::string config;
  explicit tls_pair(const std::string& name) : dir(name) {
    auto text = two_free_ports_topology();
    auto at = text.find("security = \"plain\"");
    text.replace(at, std::string{"security = \"plain\""}.size(), "security = \"tls\"\ncerts_dir = \"certs\"");
    config = dir.write("topology.toml", text);
  }
  int make_certs(const std::string& certs_dir) {
    node_process p({"--config", config, "--make-certs", "--set", "cluster.certs_dir=" + certs_dir},
                   dir.path / ("certs-" + certs_dir + ".log"), dir.path);
    return p.wait_exit(30s).value_or(-1);
  }
  std::unique_ptr<node_process> start(const std::string& node, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--config", config, "--node", node, "--set", "cluster.connect_timeout_s=5"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = std::make_unique<node_process>(args, dir.path / (node + ".log"), dir.path);
    REQUIRE(p->started());
    return p;
  }
};

}  // namespace

TEST_CASE("nodes with certificates of the cluster's CA connect over mutual TLS") {
  tls_pair t{"tls-ok"};
  REQUIRE(t.make_certs("certs") == 0);
  CHECK(std::filesystem::exists(t.dir.path / "certs/ca.pem"));
  CHECK((std::filesystem::status(t.dir.path / "certs/worker.key").permissions() &
         std::filesystem::perms::others_read) == std::filesystem::perms::none);
  auto head = t.start("head");
  auto worker = t.start("worker");
  check_joined(*head, *worker);
  CHECK(head->log().find("(mutual TLS)") != std::string::npos);
  CHECK(head->wait_exit(15s) == 0);
  CHECK(worker->wait_exit(15s) == 0);
}

TEST_CASE("a node whose certificate comes from another CA is refused") {
  tls_pair t{"tls-foreign-ca"};
  REQUIRE(t.make_certs("certs") == 0);
  REQUIRE(t.make_certs("other") == 0);  // a second, unrelated CA
  auto head = t.start("head");
  REQUIRE(head->wait_for("listening on", 10s));
  auto worker = t.start("worker", {"--set", "cluster.certs_dir=other"});
  CHECK_MESSAGE(worker->wait_exit(15s) == 5, worker->log());
  CHECK(worker->log().find("refused this node's credentials") != std::string::npos);
  CHECK(head->log().find("peer joined") == std::string::npos);
}

TEST_CASE("a node without a certificate is refused by a TLS cluster and a TLS node needs its files") {
  tls_pair t{"tls-none"};
  REQUIRE(t.make_certs("certs") == 0);
  auto head = t.start("head");
  REQUIRE(head->wait_for("listening on", 10s));
  auto plain = t.start("worker", {"--set", "cluster.security=plain"});
  CHECK_MESSAGE(plain->wait_exit(15s) == 5, plain->log());
  CHECK(plain->log().find("refused this node's credentials (here cluster.security = \"plain\")") != std::string::npos);
  CHECK(head->log().find("peer joined") == std::string::npos);
  // A TLS node whose certificate files are missing stops before starting anything.
  auto missing = t.start("worker", {"--set", "cluster.certs_dir=nowhere"});
  CHECK(missing->wait_exit(15s) == 2);
  CHECK(missing->log().find("nowhere/ca.pem (missing or unreadable)") != std::string::npos);
  CHECK(missing->log().find("--make-certs") != std::string::npos);
}
