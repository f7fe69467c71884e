// bench_wire: what the control plane costs per trajectory.
//   1. encode + decode of a trajectory (Cap'n Proto), against memcpy of the same bytes;
//   2. delivery of packed trajectories between two actor systems over loopback
//      TCP (CAF's BASP: serialization, socket, deserialization), against
//      delivery between two actors of one system (no serialization).
// Prints machine facts first, then each figure and its ratio. --quick: fewer rounds.
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "areal/actors/node.hpp"
#include "areal/kernels/blas_probe.hpp"
#include "areal/runtime/cpus.hpp"
#include "bench_common.hpp"

using namespace areal;
using areal::bench::seconds_since;
using clock_type = std::chrono::steady_clock;

namespace {

using sink_actor = caf::typed_actor<caf::replies_to<packed<trajectory>>::with<uint64_t>>;

sink_actor::behavior_type sink() {
  return {[](packed<trajectory>& t) -> uint64_t {
    auto decoded = unpack(t);
    return decoded ? decoded->output_tokens.size() : 0;
  }};
}

trajectory make_trajectory(size_t prompt, size_t output) {
  trajectory t;
  t.prompt_tokens.assign(prompt, 17);
  for (size_t i = 0; i < output; ++i) {
    t.output_tokens.push_back(static_cast<int32_t>(i % 151936));
    t.behaviour_logprobs.push_back(-0.001f * static_cast<float>(i));
    t.token_versions.push_back(static_cast<int64_t>(i / 300));
  }
  t.producer = "bench";
  return t;
}

// Sends `count` trajectories to `target` with up to `window` in flight; returns seconds.
double deliver(caf::actor_system& sys, sink_actor target, const packed<trajectory>& msg, int count, int window) {
  caf::scoped_actor self{sys};
  auto start = clock_type::now();
  int sent = 0;
  int received = 0;
  while (received < count) {
    while (sent < count && sent - received < window) {
      self->send(caf::actor_cast<caf::actor>(target), msg);
      ++sent;
    }
    self->receive([&](uint64_t) { ++received; },
                  [&](caf::error& e) {
                    std::cerr << "delivery failed: " << describe(e) << "\n";
                    std::exit(1);
                  });
  }
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  fit_blas_core(argc, argv);
  bool quick = argc == 2 && std::string{argv[1]} == "--quick";
  if (argc > 2 || (argc == 2 && !quick)) {
    std::cerr << "usage: bench_wire [--quick]\n";
    return 2;
  }
  auto facts = kernels::probe_blas();
  std::cout << "machine: " << areal::cpus().describe() << "; " << kernels::describe(facts) << "; fp32 GEMM 512^3 "
            << kernels::measure_gemm_gflops(512, 3) << " GFLOP/s (1 thread)\n";

  auto record = make_trajectory(256, 1024);
  auto bytes = *encode(record);
  std::cout << "trajectory: 256 prompt + 1024 output tokens = " << bytes.size() << " bytes on the wire\n";

  // 1. codec against memcpy.
  int rounds = quick ? 2000 : 20000;
  auto start = clock_type::now();
  size_t checksum_sink = 0;
  for (int i = 0; i < rounds; ++i) {
    auto b = encode(record);
    auto back = decode<trajectory>(*b);
    checksum_sink += back->output_tokens.size();
  }
  double codec_s = seconds_since(start);
  std::vector<char> copy(bytes.size());
  start = clock_type::now();
  for (int i = 0; i < rounds * 2; ++i) {
    std::memcpy(copy.data(), bytes.data(), bytes.size());
    checksum_sink += static_cast<size_t>(copy[i % copy.size()]);
  }
  double memcpy_s = seconds_since(start) / 2;
  double codec_mbs = static_cast<double>(bytes.size()) * rounds / codec_s / 1e6;
  double memcpy_mbs = static_cast<double>(bytes.size()) * rounds / memcpy_s / 1e6;
  std::cout << "codec: " << rounds / codec_s << " trajectories/s encode+decode, " << codec_mbs
            << " MB/s; cache-hot memcpy " << memcpy_mbs << " MB/s; codec/memcpy ratio " << codec_mbs / memcpy_mbs
            << "\n";

  // 2. delivery: local actor vs remote actor system over loopback.
  auto msg = *pack(record);
  int count = quick ? 500 : 5000;
  caf::actor_system_config cfg_a;
  configure_actor_system(cfg_a, cluster_spec{"bench"});
  caf::actor_system a{cfg_a};
  caf::actor_system_config cfg_b;
  configure_actor_system(cfg_b, cluster_spec{"bench"});
  caf::actor_system b{cfg_b};
  auto local_sink = a.spawn(sink);
  auto remote_sink_owner = b.spawn(sink);
  auto port = b.middleman().publish(remote_sink_owner, 0, "127.0.0.1");
  if (!port) {
    std::cerr << "publish failed: " << b.render(port.error()) << "\n";
    return 1;
  }
  auto remote_sink = a.middleman().remote_actor<sink_actor>("127.0.0.1", *port);
  if (!remote_sink) {
    std::cerr << "connect failed: " << a.render(remote_sink.error()) << "\n";
    return 1;
  }
  double local_s = deliver(a, local_sink, msg, count, 32);
  double remote_s = deliver(a, *remote_sink, msg, count, 32);
  double local_rate = count / local_s;
  double remote_rate = count / remote_s;
  std::cout << "delivery (decode at the receiver, 32 in flight): in-process " << local_rate << " trajectories/s; "
            << "loopback TCP " << remote_rate
            << " trajectories/s = " << remote_rate * static_cast<double>(bytes.size()) / 1e6
            << " MB/s; remote/in-process ratio " << remote_rate / local_rate << "\n";
  caf::anon_send_exit(local_sink, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(remote_sink_owner, caf::exit_reason::user_shutdown);
  return checksum_sink == 0 ? 1 : 0;
}
