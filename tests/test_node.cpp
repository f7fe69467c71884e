// The node actor's protocol, in process: type announcement, handshake rules,
// trajectory acknowledgement, run end; and every message type across two
// processes over a real loopback connection.
#include <doctest/doctest.h>

#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "areal/actors/exception_guard.hpp"
#include "areal/actors/node.hpp"
#include "sample_records.hpp"

using namespace areal;
using namespace std::chrono_literals;

namespace {

run_config two_node_config() {
  auto r = parse_config(R"([run]
name = "t"
job = "probe"
hold_s = 3600.0
[cluster]
app_id = "test"
[[nodes]]
name = "head"
port = 1
roles = ["controller"]
[[nodes]]
name = "worker"
port = 2
roles = ["rollout"]
)",
                        "test.toml");
  REQUIRE(r.config);
  return *r.config;
}

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<caf::scoped_actor> self;
  run_config config = two_node_config();

  fixture() {
    configure_actor_system(cfg, config.cluster);
    sys = std::make_unique<caf::actor_system>(cfg);
    self = std::make_unique<caf::scoped_actor>(*sys);
  }

  node_actor spawn_controller() {
    return spawn_node(*sys,
                      node_setup{config, config.nodes[0], caf::actor_cast<done_listener_actor>(caf::actor{*self})});
  }

  node_hello worker_hello() {
    node_setup setup{config, config.nodes[1], done_listener_actor{}};
    return make_hello(setup);
  }

  // Sends a hello and returns the reply or the error text.
  std::pair<std::optional<node_hello>, std::string> greet(node_actor node, const node_hello& hello) {
    std::pair<std::optional<node_hello>, std::string> out;
    (*self)
        ->request(node, 5s, *pack(hello))
        .receive([&](packed<node_hello>& reply) { out.first = *unpack(reply); },
                 [&](caf::error& err) { out.second = describe(err); });
    return out;
  }
};

}  // namespace

TEST_CASE("every carrier type survives CAF's binary serialization") {
  fixture f;
  auto msg =
      caf::make_message(*pack(test::sample_request()), *pack(test::sample_trajectory()), *pack(test::sample_manifest()),
                        *pack(test::sample_hello()), *pack(test::sample_stats()), *pack(test::sample_task()));
  std::vector<char> buf;
  caf::binary_serializer sink{*f.sys, buf};
  REQUIRE_FALSE(sink(msg));
  caf::message back;
  caf::binary_deserializer source{*f.sys, buf};
  REQUIRE_FALSE(source(back));
  REQUIRE(back.match_elements<packed<generation_request>, packed<trajectory>, packed<weight_manifest>,
                              packed<node_hello>, packed<node_stats>, packed<reward_task>>());
  CHECK(*unpack(back.get_as<packed<generation_request>>(0)) == test::sample_request());
  CHECK(*unpack(back.get_as<packed<trajectory>>(1)) == test::sample_trajectory());
  CHECK(*unpack(back.get_as<packed<weight_manifest>>(2)) == test::sample_manifest());
  CHECK(*unpack(back.get_as<packed<node_hello>>(3)) == test::sample_hello());
  CHECK(*unpack(back.get_as<packed<node_stats>>(4)) == test::sample_stats());
  CHECK(*unpack(back.get_as<packed<reward_task>>(5)) == test::sample_task());
}

TEST_CASE("the handshake refuses other protocol versions and clusters and names saying why") {
  fixture f;
  auto node = f.spawn_controller();
  auto hello = f.worker_hello();

  hello.protocol_version = 99;
  auto [reply, error] = f.greet(node, hello);
  CHECK_FALSE(reply);
  CHECK(error.find("node worker speaks protocol version 99, node head speaks protocol version " +
                   std::to_string(protocol_version)) != std::string::npos);

  hello = f.worker_hello();
  hello.app_id = "other";
  std::tie(reply, error) = f.greet(node, hello);
  CHECK(error.find("belongs to cluster \"other\", this is cluster \"test\"") != std::string::npos);

  // A hello written under another schema version cannot even be read: refused, naming both versions.
  auto bytes = *pack(f.worker_hello());
  bytes.bytes[16] = 2;  // schemaVersion, the first data word of the root struct
  (*f.self)
      ->request(node, 5s, bytes)
      .receive([](packed<node_hello>&) { FAIL("a hello of schema version 2 was accepted"); },
               [](caf::error& err) {
                 CHECK(describe(err).find("node_hello written with schema version 2, this build reads version 1") !=
                       std::string::npos);
               });

  hello = f.worker_hello();
  hello.node_name = "stranger";
  std::tie(reply, error) = f.greet(node, hello);
  CHECK(error.find("node \"stranger\" is not a peer") != std::string::npos);

  // Garbage instead of a hello: a wire error, and the node carries on.
  (*f.self)
      ->request(node, 5s, packed<node_hello>{std::vector<char>(40, '\x7f')})
      .receive([](packed<node_hello>&) { FAIL("garbage was accepted"); },
               [](caf::error& err) { CHECK(err.category() == caf::atom("wire")); });
  (*f.self)
      ->request(node, 5s, stats_atom::value)
      .receive([](packed<node_stats>& s) { CHECK(unpack(s)->node_name == "head"); },
               [](caf::error& err) { FAIL(describe(err)); });
  (*f.self)->send_exit(node, caf::exit_reason::user_shutdown);
}

TEST_CASE("a peer joins and exchanges trajectories and is told when the run ends") {
  fixture f;
  auto node = f.spawn_controller();
  auto [reply, error] = f.greet(node, f.worker_hello());
  REQUIRE_MESSAGE(reply, error);
  CHECK(reply->node_name == "head");
  CHECK(reply->roles == std::vector<std::string>{"controller"});
  CHECK(reply->protocol_version == protocol_version);

  // The same name again while connected is refused.
  auto again = f.greet(node, f.worker_hello());
  CHECK(again.second.find("already connected") != std::string::npos);

  // The controller sends us its probe trajectory: acknowledge with the checksum.
  bool probe_seen = false;
  (*f.self)->receive(
      [&](packed<trajectory>& t) -> uint64_t {
        auto decoded = unpack(t);
        REQUIRE(decoded);
        CHECK(decoded->producer == "head");
        CHECK(decoded->output_tokens.size() == decoded->token_versions.size());
        probe_seen = true;
        return checksum(t.bytes.data(), t.bytes.size());
      },
      caf::after(5s) >> [] { FAIL("no probe trajectory from the controller"); });
  CHECK(probe_seen);

  // Our trajectory is acknowledged with the checksum of its bytes.
  auto mine = *pack(test::sample_trajectory());
  (*f.self)
      ->request(node, 5s, mine)
      .receive([&](uint64_t digest) { CHECK(digest == checksum(mine.bytes.data(), mine.bytes.size())); },
               [](caf::error& err) { FAIL(describe(err)); });

  // A corrupt trajectory is refused and counted nowhere.
  auto corrupt = mine;
  corrupt.bytes.resize(corrupt.bytes.size() - 8);
  (*f.self)
      ->request(node, 5s, corrupt)
      .receive([](uint64_t) { FAIL("corrupt trajectory accepted"); },
               [](caf::error& err) { CHECK(err.category() == caf::atom("wire")); });
  (*f.self)
      ->request(node, 5s, stats_atom::value)
      .receive(
          [](packed<node_stats>& s) {
            auto stats = *unpack(s);
            CHECK(stats.peers_connected == 1);
            CHECK(stats.trajectories_received == 2);  // its own self-probe and ours
          },
          [](caf::error& err) { FAIL(describe(err)); });

  // Stopping the controller ends the run for its peers first.
  (*f.self)->send(node, shutdown_atom::value, std::string{"test over"});
  bool told = false;
  int32_t code = -1;
  for (int i = 0; i < 2; ++i)
    (*f.self)->receive(
        [&](run_end_atom, std::string& why) -> bool {
          told = true;
          CHECK(why == "test over");
          return true;
        },
        [&](done_atom, int32_t c, std::string&) { code = c; }, caf::after(5s) >> [] { FAIL("the node did not stop"); });
  CHECK(told);
  CHECK(code == exit_ok);
}

namespace {

using echo_actor = caf::typed_actor<caf::replies_to<packed<generation_request>>::with<packed<generation_request>>,
                                    caf::replies_to<packed<trajectory>>::with<packed<trajectory>>,
                                    caf::replies_to<packed<weight_manifest>>::with<packed<weight_manifest>>,
                                    caf::replies_to<packed<node_hello>>::with<packed<node_hello>>,
                                    caf::replies_to<packed<node_stats>>::with<packed<node_stats>>,
                                    caf::replies_to<packed<reward_task>>::with<packed<reward_task>>>;

echo_actor::behavior_type echo() {
  return {[](packed<generation_request>& x) { return x; }, [](packed<trajectory>& x) { return x; },
          [](packed<weight_manifest>& x) { return x; },    [](packed<node_hello>& x) { return x; },
          [](packed<node_stats>& x) { return x; },         [](packed<reward_task>& x) { return x; }};
}

// Child process: publishes an echo actor, reports its port through `fd`, and
// serves until told to stop or 20 s pass.
[[noreturn]] void run_echo_child(int fd) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg, cluster_spec{"test"});
  caf::actor_system sys{cfg};
  auto actor = sys.spawn(echo);
  auto port = sys.middleman().publish(actor, 0, "127.0.0.1");
  uint16_t p = port ? *port : 0;
  if (write(fd, &p, sizeof(p)) != sizeof(p))
    _exit(3);
  char stop;
  fd_set set;
  FD_ZERO(&set);
  FD_SET(fd, &set);
  timeval limit{20, 0};
  if (select(fd + 1, &set, nullptr, nullptr, &limit) > 0)
    (void)!read(fd, &stop, 1);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  _exit(port ? 0 : 2);
}

}  // namespace

TEST_CASE("every message type round-trips between two processes over loopback") {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fds[0]);
    run_echo_child(fds[1]);
  }
  close(fds[1]);
  uint16_t port = 0;
  REQUIRE(read(fds[0], &port, sizeof(port)) == sizeof(port));
  REQUIRE(port != 0);
  {
    fixture f;
    auto remote = f.sys->middleman().remote_actor<echo_actor>("127.0.0.1", port);
    REQUIRE_MESSAGE(remote, f.sys->render(remote.error()));
    auto round_trip = [&](auto record) {
      using record_type = decltype(record);
      (*f.self)
          ->request(*remote, 5s, *pack(record))
          .receive(
              [&](packed<record_type>& back) {
                auto decoded = unpack(back);
                REQUIRE(decoded);
                CHECK(*decoded == record);
              },
              [](caf::error& err) { FAIL(describe(err)); });
    };
    round_trip(test::sample_request());
    round_trip(test::sample_trajectory());
    round_trip(test::sample_manifest());
    round_trip(test::sample_hello());
    round_trip(test::sample_stats());
    round_trip(test::sample_task());
    // A trajectory of 1M tokens crosses too (about 20 MB on the wire).
    auto big = test::sample_trajectory();
    big.output_tokens.assign(1 << 20, 5);
    big.behaviour_logprobs.assign(1 << 20, -0.5f);
    big.token_versions.assign(1 << 20, 3);
    round_trip(big);
  }
  REQUIRE(write(fds[0], "x", 1) == 1);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  close(fds[0]);
}

TEST_CASE("an exception escaping an actor's handler ends it with an error that says what was thrown") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  for (bool guarded : {true, false}) {
    auto thrower = sys.spawn([guarded](caf::event_based_actor* a) -> caf::behavior {
      if (guarded)
        areal::guard_exceptions(a, "the test actor");
      return {[](int) -> int { throw std::runtime_error("the tokenizer has no id 99"); }};
    });
    self->monitor(thrower);
    self->send(thrower, 1);
    std::string reason;
    self->receive([&](caf::down_msg& down) { reason = sys.render(down.reason); },
                  caf::after(std::chrono::seconds(10)) >> [&] { reason = "no down message"; });
    if (guarded)
      CHECK_MESSAGE(reason.find("the test actor: unhandled exception: the tokenizer has no id 99") != std::string::npos,
                    reason);
    else  // CAF's own handler: the text is lost (what the guard is for)
      CHECK_MESSAGE(reason.find("the tokenizer has no id 99") == std::string::npos, reason);
  }
}
