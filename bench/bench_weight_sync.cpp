// bench_weight_sync: how fast a new weight version reaches the rollout nodes.
// One publisher (the trainer's node) and one or two subscribers, each in an
// actor system of its own connected over loopback TCP as separate nodes are.
// Rows: the weight transport over Gloo links (and NCCL where a GPU is), over CAF chunk messages, and
// in-process sharing (a pointer; its figure is the cost of the hand-over), each
// against the raw loopback TCP ceiling measured in the same run (plain sockets,
// one sending thread per receiver, no checksums). A transfer is timed from
// `publish` to the last subscriber's verified report, so it includes chunk
// checksums on both sides. Bytes/s count every receiver's bytes. Memory comes
// from the allocator the job runs with (kernels::tune_allocator): a version's
// buffer reuses a freed block, as the trainer's snapshots and the subscribers'
// buffers do. With glibc's defaults every 64 MiB version was a fresh mapping,
// and on the development VM the first send from fresh pages cost ~0.1 s per
// 64 MiB in the kernel's copy (every transport 0.13-0.23 of the ceiling, Gloo
// and a plain TCP link alike; 0.65 from reused blocks).
//   bench_weight_sync [--quick] [--json FILE]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <nlohmann/json.hpp>

#include "areal/actors/node.hpp"
#include "areal/actors/weight_transport.hpp"
#include "bench_common.hpp"

#include "areal/kernels/allocator.hpp"
#include "areal/kernels/compute_threads.hpp"

using namespace areal;
using namespace std::chrono_literals;

namespace {

using clock_type = std::chrono::steady_clock;

// -- the ceiling: raw loopback TCP --------------------------------------------

void send_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    auto n = ::send(fd, data, std::min<size_t>(size, 1 << 20), 0);
    if (n <= 0)
      throw std::runtime_error("send failed");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void recv_all(int fd, char* data, size_t size) {
  while (size > 0) {
    auto n = ::recv(fd, data, std::min<size_t>(size, 1 << 20), 0);
    if (n <= 0)
      throw std::runtime_error("recv failed");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Seconds to deliver `bytes` to each of `receivers` over loopback sockets, per
// repetition. The connections are made once and the first transfer is a
// warm-up (not returned), as for the transports below: a fresh connection's
// first megabytes run in TCP slow start with small socket buffers, and a
// ceiling measured on it was beaten by CAF's own messages (2.1x in one run).
std::vector<double> raw_tcp_seconds(const std::vector<char>& buffer, int receivers, int repetitions) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, receivers);
  std::vector<int> outgoing, incoming;
  for (int i = 0; i < receivers; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    incoming.push_back(fd);
    outgoing.push_back(accept(listener, nullptr, nullptr));
  }
  close(listener);
  std::vector<std::vector<char>> sinks(static_cast<size_t>(receivers), std::vector<char>(buffer.size()));
  std::vector<double> out;
  for (int r = 0; r <= repetitions; ++r) {
    auto start = clock_type::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < receivers; ++i) {
      threads.emplace_back([&, i] { send_all(outgoing[i], buffer.data(), buffer.size()); });
      threads.emplace_back([&, i] { recv_all(incoming[i], sinks[i].data(), buffer.size()); });
    }
    for (auto& t : threads)
      t.join();
    if (r > 0)
      out.push_back(bench::seconds_since(start));
  }
  for (auto fd : outgoing)
    close(fd);
  for (auto fd : incoming)
    close(fd);
  return out;
}

// -- the transport ------------------------------------------------------------

struct node_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  node_system() {
    configure_actor_system(cfg, cluster_spec{"bench"});
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

// Seconds from publish to the last report, per repetition (the first is a warm-up).
// `backend` "in-process" subscribes the sink actors of the publisher's own system.
std::vector<double> transport_seconds(const std::string& backend, size_t bytes, int receivers, int repetitions) {
  std::vector<double> out;
  auto receiving = std::make_unique<std::vector<std::unique_ptr<node_system>>>();
  node_system sending;
  {
    caf::scoped_actor self{*sending.sys};
    weight_publisher_setup ps;
    ps.backend = parse_weight_backend(backend).value_or(weight_backend::gloo);  // in-process: any
    ps.timeout = 600s;
    auto publisher = spawn_weight_publisher(*sending.sys, ps);
    std::vector<caf::actor> subscribers;
    std::vector<std::unique_ptr<caf::scoped_actor>> sinks;
    if (backend == "in-process") {
      for (int i = 0; i < receivers; ++i) {
        sinks.push_back(std::make_unique<caf::scoped_actor>(*sending.sys));
        self->request(publisher, 10s, subscribe_atom::value, "sink-" + std::to_string(i), caf::actor{*sinks.back()})
            .receive([](packed<weight_manifest>&, std::string&) {}, [](caf::error&) {});
      }
    } else {
      auto port = sending.sys->middleman().publish(publisher, 0, "127.0.0.1");
      for (int i = 0; i < receivers; ++i) {
        receiving->push_back(std::make_unique<node_system>());
        auto& node = *receiving->back();
        auto remote = node.sys->middleman().remote_actor<weight_publisher_actor>("127.0.0.1", *port);
        weight_subscriber_setup ss;
        ss.node = "receiver-" + std::to_string(i);
        ss.publisher = caf::actor_cast<caf::actor>(*remote);
        ss.allow_bulk = backend != "caf";
        ss.timeout = 600s;
        subscribers.push_back(caf::actor_cast<caf::actor>(spawn_weight_subscriber(*node.sys, ss)));
      }
      // Subscriptions (and Gloo links) are in place once the first version reaches everyone.
    }
    auto floats = static_cast<int64_t>(bytes / 4);
    for (int r = 0; r <= repetitions; ++r) {
      auto flat = at::empty({floats}, at::kFloat).uniform_(-1, 1);
      local_weights w{r + 1, std::make_shared<const at::Tensor>(flat)};
      if (backend != "in-process" && r == 0)
        std::this_thread::sleep_for(500ms);  // let the subscribers subscribe
      auto start = clock_type::now();
      bool ok = true;
      self->request(publisher, 900s, publish_atom::value, w)
          .receive(
              [&](std::vector<weight_delivery>& reports) {
                ok = static_cast<int>(reports.size()) == receivers;
                for (auto& d : reports)
                  if (!d.error.empty() || (backend != "in-process" && d.backend != backend)) {
                    std::fprintf(stderr, "  %s: version %lld via %s: %s\n", d.subscriber.c_str(),
                                 static_cast<long long>(d.version), d.backend.c_str(), d.error.c_str());
                    ok = false;
                  }
              },
              [&](caf::error& e) {
                std::fprintf(stderr, "  publish failed: %s\n", describe(e).c_str());
                ok = false;
              });
      auto seconds = bench::seconds_since(start);
      if (backend == "in-process")  // the hand-over is complete when every sink holds the pointer
        for (auto& sink : sinks)
          (*sink)->receive([](local_weights&) {}, caf::after(10s) >> [&] { ok = false; });
      if (!ok)
        return {};
      if (r > 0)
        out.push_back(seconds);
    }
    for (auto& s : subscribers)
      caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    self->send_exit(publisher, caf::exit_reason::user_shutdown);
  }
  // The sending system goes first (see test_weight_transport), then the receivers.
  sending.sys.reset();
  receiving.reset();
  return out;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0 : xs[xs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto options = bench::parse_options(argc, argv, "bench_weight_sync");
  areal::kernels::set_compute_threads(1);
  auto allocator = areal::kernels::tune_allocator();  // as areal's main: the job's buffers
  std::vector<size_t> sizes_mib = options.quick ? std::vector<size_t>{64} : std::vector<size_t>{64, 512};
  // A 64 MiB transfer takes tens of milliseconds, in which the shared machine's
  // noise moved single runs by 0.6-1.1x of the ceiling: many repetitions there.
  auto repetitions_at = [&](size_t mib) { return mib >= 512 ? 3 : options.quick ? 7 : 11; };
  std::printf(
      "bench_weight_sync: %u hardware threads, chunk %llu KiB, loopback TCP, %d (64 MiB) or %d (512 MiB) timed "
      "repetitions after a warm-up (median shown)\n",
      std::thread::hardware_concurrency(), static_cast<unsigned long long>(weight_publisher_setup{}.chunk_bytes / 1024),
      repetitions_at(64), repetitions_at(512));
  std::printf("machine: %s\nallocator: %s\nchunk checksum: %s\n", kernels::describe(kernels::probe_blas()).c_str(),
              allocator.c_str(), chunk_checksum_kind());
  std::printf("%-10s %9s %9s %12s %12s %10s\n", "path", "size_MiB", "receivers", "seconds", "GB/s", "vs_raw_tcp");
  nlohmann::json rows = nlohmann::json::array();
  for (auto mib : sizes_mib) {
    auto bytes = mib << 20;
    auto repetitions = repetitions_at(mib);
    for (int receivers : {1, 2}) {
      std::vector<char> buffer(bytes, 7);
      auto raw_s = median(raw_tcp_seconds(buffer, receivers, repetitions));
      buffer = {};
      auto total = static_cast<double>(bytes) * receivers;
      auto print = [&](const std::string& path, double seconds) {
        auto rate = seconds > 0 ? total / seconds / 1e9 : 0.0;
        auto ratio = seconds > 0 ? raw_s / seconds : 0.0;
        std::printf("%-10s %9zu %9d %12.4f %12.3f %10.3f\n", path.c_str(), mib, receivers, seconds, rate, ratio);
        std::fflush(stdout);
        rows.push_back({{"path", path},
                        {"size_mib", mib},
                        {"receivers", receivers},
                        {"seconds", seconds},
                        {"gb_per_s", rate},
                        {"vs_raw_tcp", ratio}});
      };
      print("raw-tcp", raw_s);
      std::vector<std::string> paths{"gloo", "caf", "in-process"};
      if (weight_backend_available(weight_backend::nccl))
        paths.insert(paths.begin(), "nccl");
      for (auto& path : paths) {
        auto reps = path == "caf" && mib >= 512 ? 1 : repetitions;  // CAF messages are slow: one timed run
        auto seconds = transport_seconds(path, bytes, receivers, reps);
        if (seconds.empty())
          std::printf("%-10s %9zu %9d  failed (see above)\n", path.c_str(), mib, receivers);
        else
          print(path, median(seconds));
      }
    }
  }
  if (!options.json_path.empty())
    std::ofstream(options.json_path) << nlohmann::json{{"bench", "bench_weight_sync"}, {"rows", rows}}.dump(2) << "\n";
  return 0;
}
