// The bulk weight transport between two actor systems connected over loopback
// (as two nodes are): every backend delivers buffers bit-identical to the sent
// ones; a damaged chunk is detected by its checksum and fetched again, and a
// chunk damaged every time is reported; a late subscriber starts at the newest
// version; a model of another size is refused; in-process subscribers get the
// very buffer, not a copy; the chunk checksum is XXH3-64 in each of its
// builds. Every wait is bounded.
#include "torch_doctest.hpp"

#include <atomic>
#include <cstring>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "actor_test_system.hpp"
#include "areal/actors/weight_transport.hpp"
#include "areal/runtime/failpoints.hpp"
#include "bulk_link.hpp"
#include "nccl_link.hpp"
#include "skip_case.hpp"

#include <xxhash.h>

using namespace areal;
using namespace std::chrono_literals;

namespace {

// Deterministic, not constant: a lost or shifted chunk shows.
local_weights make_weights(int64_t version, int64_t floats) {
  auto t = at::arange(floats, at::kFloat).mul_(0.001f).add_(static_cast<float>(version));
  return {version, std::make_shared<const at::Tensor>(t)};
}

bool identical(const at::Tensor& a, const at::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// A publisher in one actor system, subscribers in another, as on two nodes.
struct two_systems {
  test::actor_test_system sender, receiver;
  weight_publisher_actor publisher;
  caf::actor remote_publisher;  // the publisher as the receiving system sees it

  explicit two_systems(weight_publisher_setup setup) {
    publisher = spawn_weight_publisher(*sender.sys, std::move(setup));
    auto port = sender.sys->middleman().publish(publisher, 0, "127.0.0.1");
    REQUIRE(port);
    auto remote = receiver.sys->middleman().remote_actor<weight_publisher_actor>("127.0.0.1", *port);
    REQUIRE(remote);
    remote_publisher = caf::actor_cast<caf::actor>(*remote);
  }
  // The sending system goes first: the receiving one keeps its actors that the
  // other node holds handles to until that connection closes.
  ~two_systems() {
    (*sender.self)->send_exit(publisher, caf::exit_reason::user_shutdown);
    publisher = nullptr;
    sender.self.reset();
    sender.sys.reset();
  }

  // A subscriber on the receiving side whose sink is the receiving scoped actor.
  weight_subscriber_actor subscribe(weight_backend backend, uint64_t expected_bytes = 0) {
    weight_subscriber_setup s;
    s.node = "receiver";
    s.publisher = remote_publisher;
    s.sinks = {caf::actor{*receiver.self}};
    s.listener = caf::actor_cast<weights_listener_actor>(caf::actor{*receiver.self});
    s.expected_bytes = expected_bytes;
    s.allow_bulk = backend != weight_backend::caf;
    s.timeout = 20s;
    return spawn_weight_subscriber(*receiver.sys, s);
  }

  std::vector<weight_delivery> publish(const local_weights& w) {
    std::vector<weight_delivery> out;
    (*sender.self)
        ->request(publisher, 30s, publish_atom::value, w)
        .receive([&](std::vector<weight_delivery>& r) { out = r; }, [&](caf::error& e) { FAIL(describe(e)); });
    return out;
  }

  // Waits for the subscriber's report of a version (the listener message).
  std::string wait_report(int64_t version) {
    std::string result = "no report";
    bool done = false;
    while (!done)
      (*receiver.self)
          ->receive(
              [&](weights_atom, int64_t v, std::string& error) {
                if (v >= version) {
                  result = error;
                  done = true;
                }
              },
              [&](local_weights&) {}, caf::after(20s) >> [&] { done = true; });
    return result;
  }

  // Waits for the weights the sink receives, up to `version`.
  std::optional<local_weights> wait_weights(int64_t version) {
    std::optional<local_weights> got;
    bool done = false;
    while (!done)
      (*receiver.self)
          ->receive(
              [&](local_weights& w) {
                if (w.version >= version) {
                  got = w;
                  done = true;
                }
              },
              [&](weights_atom, int64_t, std::string&) {}, caf::after(20s) >> [&] { done = true; });
    return got;
  }
};

weight_publisher_setup setup_for(weight_backend backend) {
  weight_publisher_setup p;
  p.backend = backend;
  p.chunk_bytes = 64 * 1024;
  p.timeout = 20s;
  return p;
}

}  // namespace

TEST_CASE("weights arrive bit-identical over every backend and each version is reported") {
  for (auto backend : {weight_backend::caf, weight_backend::gloo}) {
    CAPTURE(to_string(backend));
    two_systems t{setup_for(backend)};
    auto first = make_weights(1, 300'001);  // not a multiple of the chunk size
    t.publish(first);                       // before anyone subscribed: held for late joiners
    auto sub = t.subscribe(backend);
    auto got = t.wait_weights(1);
    REQUIRE(got);
    CHECK(got->version == 1);
    CHECK(identical(*got->flat, *first.flat));

    auto second = make_weights(2, 300'001);
    auto reports = t.publish(second);
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].subscriber == "receiver");
    CHECK(reports[0].version == 2);
    CHECK(reports[0].error.empty());
    // A build without Gloo's headers sends Gloo's weights as CAF messages.
    CHECK(reports[0].backend == (weight_backend_available(backend) ? to_string(backend) : "caf"));
    CHECK(reports[0].bytes == second.flat->nbytes());
    CHECK(reports[0].resent_chunks == 0);
    got = t.wait_weights(2);
    REQUIRE(got);
    CHECK(identical(*got->flat, *second.flat));
    (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("weights arrive bit-identical over NCCL where a GPU is present and over Gloo where none is") {
  two_systems t{setup_for(weight_backend::nccl)};
  t.publish(make_weights(1, 300'001));
  auto sub = t.subscribe(weight_backend::nccl);
  REQUIRE(t.wait_weights(1));
  auto sent = make_weights(2, 300'001);
  auto reports = t.publish(sent);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].error.empty());
  // Without a GPU (or NCCL in the build) the publisher offers Gloo instead (the weights are in host memory), and says
  // so.
  // (and a build without Gloo's headers CAF messages).
  CHECK(reports[0].backend == (weight_backend_available(weight_backend::nccl)   ? "nccl"
                               : weight_backend_available(weight_backend::gloo) ? "gloo"
                                                                                : "caf"));
  if (!weight_backend_available(weight_backend::nccl))
    MESSAGE("no GPU here: the NCCL link itself is exercised on GPU machines only");
  auto got = t.wait_weights(2);
  REQUIRE(got);
  CHECK(identical(*got->flat, *sent.flat));
  (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
}

TEST_CASE("the publisher offers each subscriber only a bulk link it says it can take") {
  std::string why;
  auto offered = [&](weight_backend configured, const char* accepted, bool nccl_here, bool gloo_here) {
    return offered_link(configured, accepted, nccl_here, gloo_here, why);
  };
  auto gloo = weight_backend::gloo, nccl = weight_backend::nccl, caf = weight_backend::caf;
  CHECK(offered(gloo, "gloo", false, true) == gloo);
  CHECK(why.empty());
  CHECK(offered(gloo, "nccl gloo", true, true) == gloo);
  CHECK(offered(gloo, "", false, true) == caf);
  CHECK(why ==
        "it takes no Gloo link (its weight_transport is \"caf\", or its build has no Gloo); weights travel to "
        "it as CAF messages");
  CHECK(offered(gloo, "nccl", true, true) == caf);
  CHECK(offered(gloo, "gloonccl", true, true) == caf);  // words, not substrings
  CHECK(offered(gloo, "gloo", true, false) == caf);
  CHECK(why.find("no Gloo link here") == 0);
  CHECK(offered(nccl, "gloo nccl", true, true) == nccl);
  CHECK(why.empty());
  // A rollout node without a GPU (or without NCCL in its build) gets Gloo, not a link it cannot open.
  CHECK(offered(nccl, "gloo", true, true) == gloo);
  CHECK(why ==
        "it cannot take an NCCL link (its build has no NCCL, or its machine no GPU); weights travel to it over "
        "Gloo");
  CHECK(offered(nccl, "gloo nccl", false, true) == gloo);
  CHECK(why.find("NCCL cannot run here") == 0);
  CHECK(offered(nccl, "nccl", false, true) == caf);
  CHECK(offered(nccl, "", true, true) == caf);
  CHECK(why.find("weights travel to it as CAF messages") != std::string::npos);
  CHECK(offered(caf, "gloo nccl", true, true) == caf);
  CHECK(why.empty());

  // What a subscriber says it takes: nothing where it fetches over CAF, else what this build and machine can run.
  CHECK(accepted_links(false).empty());
  auto accepted = accepted_links(true);
  CHECK((accepted.find("gloo") != std::string::npos) == weight_backend_available(gloo));
  CHECK((accepted.find("nccl") != std::string::npos) == weight_backend_available(nccl));

  // A Gloo publisher asked by a subscriber that takes no bulk link offers CAF messages (it opens no sending side
  // that would wait out the deadline for a peer that never comes), and one that takes only NCCL the same.
  two_systems t{setup_for(gloo)};
  auto silent =
      t.receiver.sys->spawn([](caf::event_based_actor*) -> caf::behavior { return {[](packed<weight_manifest>&) {}}; });
  for (auto takes : {"", "nccl"}) {
    CAPTURE(takes);
    (*t.receiver.self)
        ->request(t.remote_publisher, 5s, subscribe_atom::value, std::string{"node"}, silent, std::string{takes})
        .receive([](packed<weight_manifest>&, std::string& link) { CHECK(link == "caf"); },
                 [](caf::error& e) { FAIL(describe(e)); });
  }
  (*t.receiver.self)->send_exit(silent, caf::exit_reason::kill);
  // A subscriber whose node fetches over CAF, end to end, from a publisher that offers Gloo.
  t.publish(make_weights(1, 300'001));
  auto sub = t.subscribe(caf);
  REQUIRE(t.wait_weights(1));
  auto reports = t.publish(make_weights(2, 300'001));
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].backend == "caf");
  CHECK(reports[0].error.empty());
  REQUIRE(t.wait_weights(2));
  (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
}

TEST_CASE("a chunk damaged in transit is detected by its checksum and fetched again") {
  std::vector<weight_backend> backends{weight_backend::caf, weight_backend::gloo};
  if (weight_backend_available(weight_backend::nccl))
    backends.push_back(weight_backend::nccl);
  for (auto backend : backends) {
    CAPTURE(to_string(backend));
    auto setup = setup_for(backend);
    auto damaged = std::make_shared<std::atomic<int>>(0);
    setup.tamper = [damaged](int64_t version, uint64_t chunk, std::string& bytes) {
      if (version == 2 && chunk == 3 && damaged->fetch_add(1) == 0)
        bytes[100] ^= 0x20;  // once: the chunk sent again is intact
    };
    two_systems t{setup};
    t.publish(make_weights(1, 100'000));
    auto sub = t.subscribe(backend);
    REQUIRE(t.wait_weights(1));
    auto sent = make_weights(2, 100'000);
    auto reports = t.publish(sent);
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].error.empty());
    CHECK(reports[0].resent_chunks == 1);
    auto got = t.wait_weights(2);
    REQUIRE(got);
    CHECK(identical(*got->flat, *sent.flat));
    CHECK(damaged->load() == 2);  // damaged once, then sent intact
    (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("a chunk damaged every time is reported and the damaged version never reaches the workers") {
  auto setup = setup_for(weight_backend::caf);
  setup.tamper = [](int64_t version, uint64_t chunk, std::string& bytes) {
    if (version == 2 && chunk == 0)
      bytes[0] ^= 1;
  };
  two_systems t{setup};
  t.publish(make_weights(1, 50'000));
  auto sub = t.subscribe(weight_backend::caf);
  REQUIRE(t.wait_weights(1));
  auto reports = t.publish(make_weights(2, 50'000));
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].error.find("failed its checksum twice") != std::string::npos);
  // The next version is fine again and arrives.
  auto third = make_weights(3, 50'000);
  reports = t.publish(third);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].error.empty());
  auto got = t.wait_weights(2);
  REQUIRE(got);
  CHECK(got->version == 3);  // version 2 was never handed to the sink
  CHECK(identical(*got->flat, *third.flat));
  (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
}

TEST_CASE("a bulk transfer cut half-way is abandoned within the deadline and the version arrives over CAF") {
  testing::skip_unless(weight_backend_available(weight_backend::gloo), "this build has no Gloo link to cut");
  auto setup = setup_for(weight_backend::gloo);
  setup.timeout = 2s;
  two_systems t{setup};
  t.publish(make_weights(1, 100'000));
  auto sub = t.subscribe(weight_backend::gloo);
  REQUIRE(t.wait_weights(1));
  // The sending side stops after half the chunks and closes the link, as when its node dies mid-transfer.
  REQUIRE(areal::failpoints::configure("weights.transfer_cut=1", 1).empty());
  auto second = make_weights(2, 100'000);
  auto started = std::chrono::steady_clock::now();
  auto reports = t.publish(second);
  REQUIRE(areal::failpoints::configure("", 1).empty());
  REQUIRE(reports.size() == 1);
  CHECK_MESSAGE(reports[0].error.empty(), reports[0].error);
  CHECK(reports[0].backend == "caf (after a gloo failure)");
  auto got = t.wait_weights(2);
  REQUIRE(got);
  CHECK(identical(*got->flat, *second.flat));
  MESSAGE(
      "version 2 arrived over CAF " << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
                                    << " s after it was published (transfer deadline 2 s)");
  // The next version travels too (over CAF: the link is not opened again).
  auto third = make_weights(3, 100'000);
  reports = t.publish(third);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].error.empty());
  got = t.wait_weights(3);
  REQUIRE(got);
  CHECK(identical(*got->flat, *third.flat));
  (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
}

TEST_CASE("a subscriber that takes the announcement and never reports is settled at the transfer deadline") {
  auto setup = setup_for(weight_backend::caf);
  setup.timeout = 1s;
  two_systems t{setup};
  // It takes every announcement and never fetches nor reports, as a node that hangs mid-transfer.
  auto silent =
      t.receiver.sys->spawn([](caf::event_based_actor*) -> caf::behavior { return {[](packed<weight_manifest>&) {}}; });
  (*t.receiver.self)
      ->request(t.remote_publisher, 5s, subscribe_atom::value, std::string{"silent"}, silent, std::string{})
      .receive([](packed<weight_manifest>&, std::string& link) { CHECK(link == "caf"); },
               [](caf::error& e) { FAIL(describe(e)); });
  auto reports = t.publish(make_weights(1, 1000));  // answered, not held
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].subscriber == "silent");
  CHECK(reports[0].error == "no report within the transfer deadline of 1000 ms");
  // The next version is published as well, and settled the same way.
  reports = t.publish(make_weights(2, 1000));
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].version == 2);
  CHECK(reports[0].error == "no report within the transfer deadline of 1000 ms");
  (*t.receiver.self)->send_exit(silent, caf::exit_reason::kill);
}

TEST_CASE("a watcher hears each subscriber's report as it comes, while a silent one holds the version") {
  auto setup = setup_for(weight_backend::caf);
  setup.timeout = 60s;  // the silent subscriber holds the version that long; the test ends before
  two_systems t{setup};
  t.publish(make_weights(1, 1000));
  auto sub = t.subscribe(weight_backend::caf);
  REQUIRE(t.wait_weights(1));
  auto silent =
      t.receiver.sys->spawn([](caf::event_based_actor*) -> caf::behavior { return {[](packed<weight_manifest>&) {}}; });
  (*t.receiver.self)
      ->request(t.remote_publisher, 5s, subscribe_atom::value, std::string{"silent"}, silent, std::string{})
      .receive([](packed<weight_manifest>&, std::string&) {}, [](caf::error& e) { FAIL(describe(e)); });
  // Version 2 published with the sending side's scoped actor as the watcher; the reply (the settled
  // reports) goes to another actor, which records that it came.
  auto settled = std::make_shared<std::atomic<bool>>(false);
  auto watcher = caf::actor{*t.sender.self};
  auto requester = t.sender.sys->spawn([publisher = t.publisher, watcher, settled](caf::event_based_actor* self) {
    self->request(publisher, 90s, publish_atom::value, make_weights(2, 1000), watcher)
        .then([settled](std::vector<weight_delivery>&) { *settled = true; });
  });
  std::optional<weight_delivery> heard;
  (*t.sender.self)->receive([&](weight_delivery& d) { heard = d; }, caf::after(20s) >> [] {});
  bool was_settled = *settled;
  (*t.sender.self)->send_exit(requester, caf::exit_reason::kill);
  (*t.receiver.self)->send_exit(silent, caf::exit_reason::kill);
  (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
  REQUIRE(heard);
  CHECK(heard->subscriber == "receiver");
  CHECK(heard->version == 2);
  CHECK(heard->error.empty());
  CHECK_FALSE(was_settled);  // "silent" had not reported: the version had not settled
}

TEST_CASE("a subscriber that joins late starts at the newest version") {
  two_systems t{setup_for(weight_backend::gloo)};
  for (int64_t v = 1; v <= 3; ++v)
    t.publish(make_weights(v, 20'000));
  auto sub = t.subscribe(weight_backend::gloo);
  auto got = t.wait_weights(1);
  REQUIRE(got);
  CHECK(got->version == 3);
  CHECK(identical(*got->flat, *make_weights(3, 20'000).flat));
  (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
}

TEST_CASE("a subscriber whose model has another size refuses the weights and says why") {
  two_systems t{setup_for(weight_backend::caf)};
  t.publish(make_weights(1, 1000));
  auto sub = t.subscribe(weight_backend::caf, 12345);
  auto error = t.wait_report(1);
  CHECK(error.find("the published weights have 4000 bytes, this node's model 12345") != std::string::npos);
  (*t.receiver.self)->send_exit(sub, caf::exit_reason::user_shutdown);
}

TEST_CASE("in-process subscribers get the trainer's buffer itself and report at once") {
  test::actor_test_system s;
  auto publisher = spawn_weight_publisher(*s.sys, setup_for(weight_backend::gloo));
  (*s.self)
      ->request(publisher, 5s, subscribe_atom::value, std::string{"local"}, caf::actor{*s.self}, std::string{})
      .receive(
          [](packed<weight_manifest>& m, std::string& link) {
            CHECK(unpack(m)->version == -1);
            CHECK(link == "in-process");
          },
          [](caf::error& e) { FAIL(describe(e)); });
  auto w = make_weights(7, 1000);
  std::vector<weight_delivery> reports;
  (*s.self)
      ->request(publisher, 5s, publish_atom::value, w)
      .receive([&](std::vector<weight_delivery>& r) { reports = r; }, [](caf::error& e) { FAIL(describe(e)); });
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].backend == "in-process");
  bool received = false;
  (*s.self)->receive(
      [&](local_weights& got) {
        received = true;
        CHECK(got.flat.get() == w.flat.get());
      },
      caf::after(5s) >> [] {});
  CHECK(received);
  (*s.self)->send_exit(publisher, caf::exit_reason::user_shutdown);
}

TEST_CASE("the chunk checksum is xxHash's XXH3-64 in every build of it, at every size and alignment") {
  // The reference: the XXH3 of Debian's libxxhash (not inlined here). Both
  // sides of a link must agree whatever their CPUs, so the build chosen for
  // this CPU and the baseline build must give the library's value.
  std::vector<unsigned char> bytes((1 << 20) + 64);
  uint64_t state = 12345;
  for (auto& b : bytes) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<unsigned char>(state >> 56);
  }
  CAPTURE(chunk_checksum_kind());
  for (size_t size : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1000, 4103, 65536, (1 << 20) + 13})
    for (size_t offset : {0, 1, 3, 8}) {
      CAPTURE(size);
      CAPTURE(offset);
      const auto* p = bytes.data() + offset;
      auto expected = static_cast<uint64_t>(XXH3_64bits(p, size));
      CHECK(chunk_checksum(p, size) == expected);
      CHECK(chunk_checksum_baseline(p, size) == expected);
    }
}

TEST_CASE("a version's chunk checksums are computed once for all the links that send it") {
  std::vector<unsigned char> a(4096, 1), b(4096, 2);
  chunk_sums sums(64);
  // Two senders at once over the same chunks: each chunk's value is the
  // checksum of the bytes its first caller gave, whoever that was.
  std::vector<uint64_t> got_a(64), got_b(64);
  std::thread other([&] {
    for (uint64_t i = 0; i < 64; ++i)
      got_b[i] = sums.get(i, b.data(), b.size());
  });
  for (uint64_t i = 0; i < 64; ++i)
    got_a[i] = sums.get(i, a.data(), a.size());
  other.join();
  CHECK(got_a == got_b);
  for (auto s : got_a)
    CHECK((s == chunk_checksum(a.data(), a.size()) || s == chunk_checksum(b.data(), b.size())));
  // A later link reads them: its own bytes are not hashed again.
  std::vector<unsigned char> c(4096, 3);
  for (uint64_t i = 0; i < 64; ++i)
    CHECK(sums.get(i, c.data(), c.size()) == got_a[i]);
}

TEST_CASE("checksums computed on a GPU are recorded for the links and fetches after it, never over one known") {
  std::vector<unsigned char> bytes(4096, 1);
  chunk_sums sums(2);
  CHECK_FALSE(sums.known(0));  // a later NCCL link computes them only while some are not known
  sums.put(0, 42);  // the GPU's value: later readers take it, their bytes are not hashed
  CHECK(sums.known(0) == std::optional<uint64_t>{42});
  CHECK(sums.get(0, bytes.data(), bytes.size()) == 42);
  CHECK_FALSE(sums.known(1));
  auto hashed = sums.get(1, bytes.data(), bytes.size());
  CHECK(sums.known(1) == std::optional<uint64_t>{hashed});
  sums.put(1, 7);  // known already: kept
  CHECK(sums.get(1, bytes.data(), bytes.size()) == hashed);
}

TEST_CASE("the trainer keeps the versions it publishes on its GPU only where NCCL links send them from there") {
  CHECK(published_device(weight_backend::gloo, "cuda:1") == "cpu");
  CHECK(published_device(weight_backend::caf, "cuda") == "cpu");
  CHECK(published_device(weight_backend::nccl, "cpu") == "cpu");
  CHECK(published_device(weight_backend::nccl, "cuda:1") ==
        (weight_backend_available(weight_backend::nccl) ? "cuda:1" : "cpu"));
  // The NCCL link's GPU: the device's index, the first GPU for "cuda" or a device that is not one.
  CHECK(gpu_of("cuda:1") == 1);
  CHECK(gpu_of("cuda") == 0);
  CHECK(gpu_of("cpu") == 0);
}
