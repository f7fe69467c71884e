// One node process: actor system, publishing, signals, bounded shutdown.
#include <netdb.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>

#include "areal/actors/node.hpp"
#include "areal/actors/rl_job.hpp"
#include "areal/runtime/log.hpp"

namespace areal {

namespace {

// Bounds the time from "run ended" to process exit: CAF 0.17 waits for every
// actor at shutdown, and a leaked handle or a stuck detached actor would hang
// it forever. After the grace period the process exits with the run's code.
class exit_watchdog {
 public:
  explicit exit_watchdog(std::chrono::seconds grace) : grace_(grace) {}

  void arm(int code) {
    thread_ = std::thread([this, code] {
      std::unique_lock<std::mutex> guard{mutex_};
      if (!done_cv_.wait_for(guard, grace_, [this] { return disarmed_; })) {
        spdlog::error("shutdown did not finish within {} s; exiting anyway", grace_.count());
        spdlog::default_logger()->flush();
        std::_Exit(code);
      }
    });
  }

  ~exit_watchdog() {
    {
      std::lock_guard<std::mutex> guard{mutex_};
      disarmed_ = true;
    }
    done_cv_.notify_all();
    if (thread_.joinable())
      thread_.join();
  }

 private:
  std::chrono::seconds grace_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool disarmed_ = false;
  std::thread thread_;
};

// Why `host` does not resolve to an address here; empty when it does.
std::string resolve_error(const std::string& host) {
  if (host.empty())
    return {};  // every interface
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found)
    ::freeaddrinfo(found);
  return rc == 0 ? std::string{} : std::string{::gai_strerror(rc)};
}

}  // namespace

bool runs_whole_job(const run_config& config, const node_spec& node) {
  return config.nodes.size() == 1 && node.has(role::controller) && node.has(role::trainer) && node.has(role::rollout) &&
         node.has(role::reward);
}

bool runs_rl_job(const run_config& config, const node_spec& node) {
  return runs_whole_job(config, node) || (node.has(role::controller) && !config.run.probe_only);
}

int run_node(const run_config& config, const node_spec& self_spec, const node_run_options& options) {
  // Stop signals are blocked in every thread (CAF's threads inherit this mask)
  // and taken by one waiter thread, which stops the run or the node. SIGUSR1
  // only wakes the waiter when the node stopped by itself.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // One process with every role runs the whole job without a node actor; in a
  // multi-node RL run the controller node runs the job and the others serve it.
  bool whole = runs_whole_job(config, self_spec);
  bool runs_job = runs_rl_job(config, self_spec);
  if (options.resume && !runs_job)
    spdlog::warn("--resume applies to the controller node; this node ignores it");
  exit_watchdog watchdog{std::chrono::seconds(4)};
  int code = exit_failure;
  {
    caf::actor_system_config cfg;
    configure_actor_system(cfg, config.cluster, uses_tls(config) ? self_spec.name : std::string{});
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    node_actor node;
    if (!whole) {
      node = spawn_node(sys, node_setup{config, self_spec, caf::actor_cast<done_listener_actor>(caf::actor{self})});
      if (self_spec.port != 0) {
        if (auto unresolved = resolve_error(self_spec.host); !unresolved.empty()) {
          spdlog::error(
              "cannot listen on {}:{}: the host does not resolve ({}); give node {} in {} an IP address or a "
              "name this machine resolves",
              self_spec.host, self_spec.port, unresolved, self_spec.name, config.source);
          self->send_exit(node, caf::exit_reason::user_shutdown);
          return exit_bad_input;
        }
        // Reusing the address (SO_REUSEADDR) lets a node that stopped listen again at once on its port,
        // which the last run's connections otherwise hold for a minute (TIME_WAIT); a port another
        // process listens on is still refused.
        constexpr bool reuse_address = true;
        auto port = uses_tls(config)
                        ? caf::openssl::publish(node, self_spec.port, self_spec.host.c_str(), reuse_address)
                        : sys.middleman().publish(node, self_spec.port, self_spec.host.c_str(), reuse_address);
        if (!port) {
          spdlog::error(
              "cannot listen on {}:{}: {}. Another process may use the port: stop it, or change the port of "
              "node {} in {}",
              self_spec.host, self_spec.port, sys.render(port.error()), self_spec.name, config.source);
          self->send_exit(node, caf::exit_reason::user_shutdown);
          return exit_bad_input;
        }
        spdlog::info("listening on {}:{}{}", self_spec.host, *port, uses_tls(config) ? " (mutual TLS)" : "");
      }
    }

    std::atomic<bool> stopping{false};
    std::atomic<bool> stop_job{false};
    std::thread signal_waiter([&] {
      int sig = 0;
      while (sigwait(&signals, &sig) == 0) {
        if (stopping.load())
          return;
        if (sig == SIGUSR1)
          continue;
        auto name = sig == SIGINT ? "SIGINT" : "SIGTERM";
        if (runs_job) {
          spdlog::info("received {}; stopping the run", name);
          stop_job = true;
        } else {
          spdlog::info("received {}; stopping the node", name);
          caf::anon_send(node, shutdown_atom::value, std::string{"stopped by "} + name);
        }
      }
    });

    if (runs_job) {
      rl_job_options job;
      job.config = config;
      job.run_dir = options.run_dir;
      job.resume = options.resume;
      job.compute_threads = static_cast<int>(self_spec.compute_threads);
      job.progress = options.progress;
      job.node = node;
      job.self = self_spec;
      auto result = run_rl_job(sys, job, stop_job);
      code = result.exit_code;
      if (node) {
        // The node actor tells every peer that the run ended, then reports done.
        caf::anon_send(node, shutdown_atom::value, result.why.empty() ? std::string{"run ended"} : result.why);
        self->receive(
            [&](done_atom, int32_t, std::string&) {},
            caf::after(std::chrono::seconds(10)) >> [] { spdlog::warn("peers did not confirm the run end"); });
      }
    } else {
      self->receive([&](done_atom, int32_t exit_code, std::string&) { code = exit_code; });
    }

    stopping = true;
    pthread_kill(signal_waiter.native_handle(), SIGUSR1);
    signal_waiter.join();
    watchdog.arm(code);
    if (node)
      self->send_exit(node, caf::exit_reason::user_shutdown);
    node = nullptr;
  }  // the actor system shuts down here
  spdlog::info("node exited with code {}", code);
  return code;
}

}  // namespace areal
