// bench_weight_sync: how fast a new weight version reaches the rollout nodes.
// One publisher (the trainer's node) and one or two subscribers, each in an
// actor system of its own connected over loopback TCP as separate nodes are.
// Rows: the weight transport over Gloo links (and NCCL, host-staged, where a GPU is), over CAF chunk messages, and
// in-process sharing (a pointer; its figure is the cost of the hand-over), each
// against the raw loopback TCP ceiling (plain sockets, one sending thread per
// receiver, no checksums) measured alternately with it: each transfer of a path
// is paired with a raw transfer just before it, and the row's ratio is the
// median of the pairs' ratios, so that a drift of the shared machine's speed
// moves both sides of a pair alike. A transfer is timed from
// `publish` to the last subscriber's verified report, so it includes chunk
// checksums on both sides. Bytes/s count every receiver's bytes. Memory comes
// from the allocator the job runs with (kernels::tune_allocator): a version's
// buffer reuses a freed block, as the trainer's snapshots and the subscribers'
// buffers do. With glibc's defaults every 64 MiB version was a fresh mapping,
// and on the development VM the first send from fresh pages cost ~0.1 s per
// 64 MiB in the kernel's copy (every transport 0.13-0.23 of the ceiling, Gloo
// and a plain TCP link alike; 0.65 from reused blocks). With two or more GPUs,
// `nccl-gpu` rows: a version on GPU 0 over NCCL into the GPUs of one or two
// receivers, against a device-to-device copy to the same GPUs (paired alike).
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
#include <optional>
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
#include "areal/kernels/device.hpp"
#include "areal/runtime/cpus.hpp"

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

// `receivers` loopback socket pairs, connected once; transfer() delivers the
// buffer to each. The constructor runs a warm-up transfer, as the transports'
// rigs do: a fresh connection's first megabytes run in TCP slow start with
// small socket buffers, and a ceiling measured on it was beaten by CAF's own
// messages (2.1x in one run).
class raw_tcp_rig {
 public:
  raw_tcp_rig(size_t bytes, int receivers) : buffer_(bytes, 7) {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    listen(listener, receivers);
    for (int i = 0; i < receivers; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      incoming_.push_back(fd);
      outgoing_.push_back(accept(listener, nullptr, nullptr));
    }
    close(listener);
    sinks_.assign(static_cast<size_t>(receivers), std::vector<char>(bytes));
    transfer();
  }
  ~raw_tcp_rig() {
    for (auto fd : outgoing_)
      close(fd);
    for (auto fd : incoming_)
      close(fd);
  }
  raw_tcp_rig(const raw_tcp_rig&) = delete;
  raw_tcp_rig& operator=(const raw_tcp_rig&) = delete;

  double transfer() {
    auto start = clock_type::now();
    std::vector<std::thread> threads;
    for (size_t i = 0; i < sinks_.size(); ++i) {
      threads.emplace_back([this, i] { send_all(outgoing_[i], buffer_.data(), buffer_.size()); });
      threads.emplace_back([this, i] { recv_all(incoming_[i], sinks_[i].data(), buffer_.size()); });
    }
    for (auto& t : threads)
      t.join();
    return bench::seconds_since(start);
  }

 private:
  std::vector<char> buffer_;
  std::vector<std::vector<char>> sinks_;
  std::vector<int> outgoing_, incoming_;
};

// -- the transport ------------------------------------------------------------

struct node_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  node_system() {
    configure_actor_system(cfg, cluster_spec{"bench"});
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

// One publisher and `receivers` subscribers of a backend, set up once; transfer()
// publishes the next version and returns the seconds from `publish` to the last
// subscriber's verified report, or nothing when a delivery failed (said on
// stderr). The constructor runs a warm-up transfer, which also puts the
// subscriptions (and Gloo links) in place. `backend` "in-process" subscribes
// sink actors of the publisher's own system.
// `on_gpus`: the versions are made on GPU 0, as a trainer there publishes them over NCCL, and subscriber i
// keeps them on GPU i + 1.
class transport_rig {
 public:
  transport_rig(const std::string& backend, size_t bytes, int receivers, bool on_gpus = false)
      : backend_(backend), floats_(static_cast<int64_t>(bytes / 4)), receivers_(receivers), on_gpus_(on_gpus) {
    self_ = std::make_unique<caf::scoped_actor>(*sending_->sys);
    weight_publisher_setup ps;
    ps.backend = parse_weight_backend(backend).value_or(weight_backend::gloo);  // in-process: any
    ps.device = on_gpus ? "cuda:0" : "cpu";
    ps.timeout = 600s;
    publisher_ = spawn_weight_publisher(*sending_->sys, ps);
    if (backend == "in-process") {
      for (int i = 0; i < receivers; ++i) {
        sinks_.push_back(std::make_unique<caf::scoped_actor>(*sending_->sys));
        (*self_)
            ->request(publisher_, 10s, subscribe_atom::value, "sink-" + std::to_string(i), caf::actor{*sinks_.back()},
                      std::string{})
            .receive([](packed<weight_manifest>&, std::string&) {}, [](caf::error&) {});
      }
    } else {
      auto port = sending_->sys->middleman().publish(publisher_, 0, "127.0.0.1");
      for (int i = 0; i < receivers; ++i) {
        receiving_.push_back(std::make_unique<node_system>());
        auto& node = *receiving_.back();
        auto remote = node.sys->middleman().remote_actor<weight_publisher_actor>("127.0.0.1", *port);
        weight_subscriber_setup ss;
        ss.node = "receiver-" + std::to_string(i);
        ss.publisher = caf::actor_cast<caf::actor>(*remote);
        ss.allow_bulk = backend != "caf";
        ss.device = on_gpus ? "cuda:" + std::to_string(i + 1) : "cpu";
        ss.timeout = 600s;
        subscribers_.push_back(caf::actor_cast<caf::actor>(spawn_weight_subscriber(*node.sys, ss)));
      }
      std::this_thread::sleep_for(500ms);  // let the subscribers subscribe
    }
    warm_ = transfer().has_value();
  }
  ~transport_rig() {
    for (auto& s : subscribers_)
      caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    (*self_)->send_exit(publisher_, caf::exit_reason::user_shutdown);
    sinks_.clear();
    self_.reset();
    // The sending system goes first (see test_weight_transport), then the receivers.
    sending_->sys.reset();
    receiving_.clear();
  }
  transport_rig(const transport_rig&) = delete;
  transport_rig& operator=(const transport_rig&) = delete;

  /// Whether the warm-up transfer was delivered.
  bool ready() const { return warm_; }

  std::optional<double> transfer() {
    auto where = at::Device(on_gpus_ ? "cuda:0" : "cpu");
    auto flat = at::empty({floats_}, at::TensorOptions(at::kFloat).device(where)).uniform_(-1, 1);
    kernels::synchronize(where);  // as the trainer does before it publishes a snapshot on a GPU
    local_weights w{++version_, std::make_shared<const at::Tensor>(flat)};
    auto start = clock_type::now();
    bool ok = true;
    (*self_)
        ->request(publisher_, 900s, publish_atom::value, w)
        .receive(
            [&](std::vector<weight_delivery>& reports) {
              ok = static_cast<int>(reports.size()) == receivers_;
              for (auto& d : reports)
                if (!d.error.empty() || (backend_ != "in-process" && d.backend != backend_) ||
                    (on_gpus_ && d.resent_chunks > 0)) {  // a GPU's checksums that disagree are a failure here
                  std::fprintf(stderr, "  %s: version %lld via %s: %s (%u chunks fetched again)\n",
                               d.subscriber.c_str(), static_cast<long long>(d.version), d.backend.c_str(),
                               d.error.c_str(), d.resent_chunks);
                  ok = false;
                }
            },
            [&](caf::error& e) {
              std::fprintf(stderr, "  publish failed: %s\n", describe(e).c_str());
              ok = false;
            });
    auto seconds = bench::seconds_since(start);
    if (backend_ == "in-process")  // the hand-over is complete when every sink holds the pointer
      for (auto& sink : sinks_)
        (*sink)->receive([](local_weights&) {}, caf::after(10s) >> [&] { ok = false; });
    if (!ok)
      return std::nullopt;
    return seconds;
  }

 private:
  std::string backend_;
  int64_t floats_;
  int receivers_;
  bool on_gpus_;
  int64_t version_ = 0;
  bool warm_ = false;
  // Receivers first: members are destroyed in reverse, and the destructor has already ended the rest.
  std::vector<std::unique_ptr<node_system>> receiving_;
  std::unique_ptr<node_system> sending_ = std::make_unique<node_system>();
  std::unique_ptr<caf::scoped_actor> self_;
  weight_publisher_actor publisher_;
  std::vector<caf::actor> subscribers_;
  std::vector<std::unique_ptr<caf::scoped_actor>> sinks_;
};

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0 : xs[xs.size() / 2];
}

// `repetitions` transfers of the rig, each paired with a ceiling's transfer just before it: the
// seconds of both and the pairs' ratios (ceiling over path). Empty path seconds when a transfer failed.
struct paired_runs {
  std::vector<double> ceiling_s, path_s, ratios;
};

template <typename ceiling_transfer>
paired_runs run_paired(transport_rig& rig, ceiling_transfer ceiling, int repetitions) {
  paired_runs out;
  for (int r = 0; rig.ready() && r < repetitions; ++r) {
    out.ceiling_s.push_back(ceiling());
    auto seconds = rig.transfer();
    if (!seconds) {
      out.path_s.clear();
      break;
    }
    out.path_s.push_back(*seconds);
    out.ratios.push_back(out.ceiling_s.back() / *seconds);
  }
  return out;
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
      "bench_weight_sync: %s, chunk %llu KiB, loopback TCP, %d (64 MiB) or %d (512 MiB) timed "
      "transfers after a warm-up, each paired with a raw TCP transfer just before it (medians shown; vs_raw_tcp: "
      "the median of the pairs' ratios)\n",
      areal::cpus().describe().c_str(), static_cast<unsigned long long>(weight_publisher_setup{}.chunk_bytes / 1024),
      repetitions_at(64), repetitions_at(512));
  std::printf("machine: %s\nallocator: %s\nchunk checksum: %s\n", kernels::describe(kernels::probe_blas()).c_str(),
              allocator.c_str(), chunk_checksum_kind());
  std::printf("%-10s %9s %9s %12s %12s %12s %10s\n", "path", "size_MiB", "receivers", "seconds", "GB/s",
              "raw_tcp_s", "vs_raw_tcp");
  nlohmann::json rows = nlohmann::json::array();
  for (auto mib : sizes_mib) {
    auto bytes = mib << 20;
    auto repetitions = repetitions_at(mib);
    for (int receivers : {1, 2}) {
      auto total = static_cast<double>(bytes) * receivers;
      // seconds: the path's median; raw: the median of the raw transfers paired with it; ratio: the
      // median of the pairs' ratios (raw over the path's).
      auto print = [&](const std::string& path, double seconds, double raw, double ratio) {
        auto rate = seconds > 0 ? total / seconds / 1e9 : 0.0;
        std::printf("%-10s %9zu %9d %12.4f %12.3f %12.4f %10.3f\n", path.c_str(), mib, receivers, seconds, rate, raw,
                    ratio);
        std::fflush(stdout);
        rows.push_back({{"path", path},
                        {"size_mib", mib},
                        {"receivers", receivers},
                        {"seconds", seconds},
                        {"gb_per_s", rate},
                        {"raw_tcp_seconds", raw},
                        {"vs_raw_tcp", ratio}});
      };
      std::vector<std::string> paths{"gloo", "caf", "in-process"};
      if (weight_backend_available(weight_backend::nccl))
        paths.insert(paths.begin(), "nccl");
      std::vector<double> all_raw;
      for (auto& path : paths) {
        auto reps = path == "caf" && mib >= 512 ? 1 : repetitions;  // CAF messages are slow: one timed pair
        paired_runs runs;
        {
          raw_tcp_rig raw(bytes, receivers);
          transport_rig rig(path, bytes, receivers);
          runs = run_paired(
              rig, [&] { return raw.transfer(); }, reps);
        }
        all_raw.insert(all_raw.end(), runs.ceiling_s.begin(), runs.ceiling_s.end());
        if (runs.path_s.empty())
          std::printf("%-10s %9zu %9d  failed (see above)\n", path.c_str(), mib, receivers);
        else
          print(path, median(runs.path_s), median(runs.ceiling_s), median(runs.ratios));
      }
      print("raw-tcp", median(all_raw), median(all_raw), 1.0);  // every path's paired raw transfers
    }
  }
  // NCCL from GPU to GPU: a version on GPU 0 (the trainer's) into GPU i + 1 of each receiver, against a
  // device-to-device copy of the same bytes to the same GPUs, each transfer paired with a copy just
  // before it. NCCL refuses two ranks on one GPU: with one GPU there is no such row (bench_device's (d)
  // measures the host staging there).
  int gpus = kernels::gpu_count();
  if (weight_backend_available(weight_backend::nccl) && gpus >= 2) {
    std::printf("GPU to GPU over NCCL, against a device-to-device copy (%d GPUs)\n%-10s %9s %9s %12s %12s %12s %10s\n",
                gpus, "path", "size_MiB", "receivers", "seconds", "GB/s", "copy_s", "vs_copy");
    for (auto mib : sizes_mib) {
      auto bytes = mib << 20;
      for (int receivers = 1; receivers <= std::min(2, gpus - 1); ++receivers) {
        auto floats = static_cast<int64_t>(bytes / 4);
        auto source = at::empty({floats}, at::TensorOptions(at::kFloat).device(at::Device("cuda:0"))).uniform_(-1, 1);
        std::vector<at::Tensor> copies;
        for (int i = 0; i < receivers; ++i)
          copies.push_back(at::empty_like(source, at::TensorOptions().device("cuda:" + std::to_string(i + 1))));
        auto copy = [&] {
          kernels::synchronize(source.device());
          auto start = clock_type::now();
          for (auto& c : copies)
            c.copy_(source);
          for (auto& c : copies)
            kernels::synchronize(c.device());
          return bench::seconds_since(start);
        };
        copy();  // warm-up: peer access, the copy engines
        paired_runs runs;
        {
          transport_rig rig("nccl", bytes, receivers, true);
          runs = run_paired(rig, copy, repetitions_at(mib));
        }
        if (runs.path_s.empty()) {
          std::printf("%-10s %9zu %9d  failed (see above)\n", "nccl-gpu", mib, receivers);
          continue;
        }
        auto seconds = median(runs.path_s);
        auto rate = static_cast<double>(bytes) * receivers / seconds / 1e9;
        std::printf("%-10s %9zu %9d %12.4f %12.3f %12.4f %10.3f\n", "nccl-gpu", mib, receivers, seconds, rate,
                    median(runs.ceiling_s), median(runs.ratios));
        std::fflush(stdout);
        rows.push_back({{"path", "nccl-gpu"},
                        {"size_mib", mib},
                        {"receivers", receivers},
                        {"seconds", seconds},
                        {"gb_per_s", rate},
                        {"device_copy_seconds", median(runs.ceiling_s)},
                        {"vs_device_copy", median(runs.ratios)}});
      }
    }
  } else {
    std::printf("GPU to GPU over NCCL: not measured (%s)\n",
                gpus >= 2 ? "this build has no NCCL" : "it needs two GPUs; NCCL refuses two ranks on one GPU");
  }
  if (!options.json_path.empty())
    std::ofstream(options.json_path) << nlohmann::json{{"bench", "bench_weight_sync"}, {"rows", rows}}.dump(2) << "\n";
  return 0;
}
