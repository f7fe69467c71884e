// The authenticated rendezvous store of the bulk links: peers holding the
// run's secret are served; foreign processes (a wrong secret, garbage, silence)
// are refused while the others go on; the store listens on its node's
// topology address only; a client refuses a server without the secret; and
// Gloo links meet there while foreign processes knock.
#include "torch_doctest.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "gloo_link.hpp"
#include "rendezvous_store.hpp"
#include "skip_case.hpp"

using namespace areal;
using namespace std::chrono_literals;

namespace {

const std::string secret = make_store_secret();

// Runs a Python script as a separate process (the foreign peer) and returns what it printed.
std::string run_python(const std::string& script) {
  std::string command = "python3 -c '" + script + "' 2>&1";
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe);
  std::array<char, 256> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe))
    out += buffer.data();
  ::pclose(pipe);
  return out;
}

// A foreign process: connects, reads the greeting, answers with `answer`, and
// prints how many bytes came back before the store hung up.
std::string foreign_peer(uint16_t port, const std::string& answer_expression) {
  return run_python(
      "import socket\n"
      "s = socket.create_connection((\"127.0.0.1\", " + std::to_string(port) + "), timeout=10)\n"
      "hello = s.recv(45)\n"
      "s.sendall(" + answer_expression + ")\n"
      "try:\n"
      "    rest = s.recv(100)\n"
      "except ConnectionResetError:\n"
      "    rest = b\"\"\n"
      "print(\"greeting\", len(hello), \"then\", len(rest), \"bytes\")\n");
}

void check_served(store_client& c, const std::string& key) {
  c.set(key, {1, 2, 3});
  CHECK(c.get(key, 1s) == std::vector<uint8_t>{1, 2, 3});
  CHECK(c.check({key}));
}

}  // namespace

TEST_CASE("the rendezvous store serves the peers that hold the run's secret") {
  store_server server{"127.0.0.1", secret};
  store_client a{"127.0.0.1", server.port(), secret, 5s};
  store_client b{"127.0.0.1", server.port(), secret, 5s};
  check_served(a, "rank_0");
  CHECK(b.get("rank_0", 1s) == std::vector<uint8_t>{1, 2, 3});
  // get waits for a key another peer sets later, and times out with a typed error.
  std::thread later{[&] {
    std::this_thread::sleep_for(100ms);
    b.set("rank_1", {9});
  }};
  CHECK(a.get("rank_1", 5s) == std::vector<uint8_t>{9});
  later.join();
  CHECK_THROWS_WITH_AS(a.get("never", 200ms), doctest::Contains("timed out after 200 ms"), store_error);
  CHECK(a.add("counter", 2) == 2);
  CHECK(b.add("counter", 3) == 5);
  CHECK(a.size() == 3);
  CHECK(a.erase("counter"));
  CHECK_FALSE(a.check({"rank_0", "counter"}));
  CHECK(server.admitted() == 2);
  CHECK(server.refused() == 0);
}

TEST_CASE("a wait on an abandoned link's keys ends at once and the other links' keys are served") {
  store_server server{"127.0.0.1", secret};
  store_client waiting{"127.0.0.1", server.port(), secret, 5s};
  store_client other{"127.0.0.1", server.port(), secret, 5s};
  // The sending side of link 1 waits for its receiver's key; the receiver is gone and the publisher abandons it.
  std::string error;
  std::thread sender{[&] {
    try {
      waiting.get("areal/node/1/rank_1", 60s);
    } catch (const store_error& e) {
      error = e.what();
    }
  }};
  std::this_thread::sleep_for(100ms);
  server.abandon("areal/node/1/");
  sender.join();  // at once: not after the 60 s the wait asked for
  CHECK(error ==
        "rendezvous store: the wait for \"areal/node/1/rank_1\" was abandoned (the peer it waited for is gone)");
  // Later waits on it end too; link 10 of the same node (a prefix of its keys is not the abandoned one) is served.
  CHECK_THROWS_WITH_AS(other.wait({"areal/node/1/x"}, 60s), doctest::Contains("was abandoned"), store_error);
  check_served(other, "areal/node/10/rank_1");
  check_served(other, "areal/node/2/rank_1");
}

TEST_CASE("foreign processes at the rendezvous store are refused while the run's peers go on") {
  store_server server{"127.0.0.1", secret, 500ms};
  store_client peer{"127.0.0.1", server.port(), secret, 5s};
  check_served(peer, "before");

  // A wrong secret: refused, and the client says so.
  CHECK_THROWS_WITH_AS((store_client{"127.0.0.1", server.port(), make_store_secret(), 5s}),
                       doctest::Contains("refused this node"), store_error);
  CHECK(server.refused() == 1);
  // A foreign process that answers the challenge with zeros, then tries a request:
  // the store hangs up without a byte.
  auto zeros = foreign_peer(server.port(), "bytes(64) + bytes([2, 0, 0, 0, 0, 1, 0, 0, 0, 6, 0, 0, 0]) + b\"before\"");
  CHECK(zeros.find("greeting 45 then 0 bytes") != std::string::npos);
  CHECK(server.refused() == 2);
  // One that speaks c10d's TCPStore protocol (a query for a key) gets nothing either.
  auto tcpstore = foreign_peer(server.port(), "bytes([0]) + b\"before\" + bytes(100)");
  CHECK(tcpstore.find("then 0 bytes") != std::string::npos);
  CHECK(server.refused() == 3);
  // A silent one is dropped after the handshake timeout; meanwhile the store serves the peer.
  auto silent = std::thread{[&] {
    run_python("import socket, time\n"
               "s = socket.create_connection((\"127.0.0.1\", " + std::to_string(server.port()) + "))\n"
               "time.sleep(2)\n");
  }};
  std::this_thread::sleep_for(100ms);
  check_served(peer, "during");
  silent.join();
  CHECK(server.refused() == 4);
  check_served(peer, "after");
  CHECK(server.admitted() == 1);
}

TEST_CASE("the rendezvous store listens on its node's address only") {
  store_server server{"127.0.0.1", secret};
  // 127.0.0.2 is this machine too (loopback), but not the address the topology gave.
  CHECK_THROWS_WITH_AS((store_client{"127.0.0.2", server.port(), secret, 2s}), doctest::Contains("cannot connect"),
                       store_error);
  store_client here{"127.0.0.1", server.port(), secret, 2s};
  check_served(here, "k");
}

TEST_CASE("a client refuses a rendezvous that does not hold the run's secret") {
  // A fake store: the right greeting, then a proof made without the secret.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(ready[0]);
    auto script = "import socket, os\n"
                  "l = socket.socket(); l.bind((\"127.0.0.1\", 0)); l.listen(1)\n"
                  "os.write(" + std::to_string(ready[1]) + ", str(l.getsockname()[1]).encode())\n"
                  "c, _ = l.accept(); c.sendall(b\"areal-store-1\" + bytes(32)); c.recv(64); c.sendall(bytes(32))\n"
                  "c.recv(1)\n";
    ::execlp("python3", "python3", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(ready[1]);
  char port_text[16] = {};
  REQUIRE(::read(ready[0], port_text, sizeof port_text - 1) > 0);
  ::close(ready[0]);
  CHECK_THROWS_WITH_AS((store_client{"127.0.0.1", static_cast<uint16_t>(std::stoi(port_text)), secret, 5s}),
                       doctest::Contains("the server does not hold the run's secret"), store_error);
  int status = 0;
  ::waitpid(child, &status, 0);
}

TEST_CASE("Gloo links meet at the rendezvous and carry bytes while foreign processes are refused there") {
  testing::skip_unless(gloo_available(), gloo_absent_reason());
  gloo_rendezvous rendezvous{"127.0.0.1", 20s};
  auto port = rendezvous.port();
  // Knocking all along: three foreign connections answering the challenge with zeros.
  std::thread foreign{[port] {
    for (int i = 0; i < 3; ++i)
      CHECK(foreign_peer(port, "bytes(64)").find("then 0 bytes") != std::string::npos);
  }};
  std::unique_ptr<gloo_link> sender;
  std::thread open_sender{[&] { sender = std::make_unique<gloo_link>(rendezvous, "areal/test/1", 20s); }};
  gloo_link receiver{"127.0.0.1", port, rendezvous.secret(), "areal/test/1", "127.0.0.1", 20s};
  open_sender.join();
  auto bytes = at::randint(0, 256, {1 << 20}, at::kByte);
  auto got = at::zeros({1 << 20}, at::kByte);
  std::thread send{[&] { sender->send(bytes, 1); }};
  receiver.recv(got, 1);
  send.join();
  CHECK(at::equal(bytes, got));
  foreign.join();
  CHECK(rendezvous.refused() == 3);
  // A receiving side with another run's secret cannot open a link there.
  CHECK_THROWS_WITH_AS((gloo_link{"127.0.0.1", port, make_store_secret(), "areal/test/2", "127.0.0.1", 2s}),
                       doctest::Contains("refused this node"), std::runtime_error);
  CHECK(rendezvous.refused() == 4);
}
