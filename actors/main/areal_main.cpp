// areal: runs one node of an areal topology (see `areal --help`). The program
// sits above every library (runtime, kernels, actors), so it lives here, with
// the actors it starts, and not in runtime/, the lowest layer.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "areal/actors/node.hpp"
#include "areal/actors/weight_transport.hpp"
#include "areal/kernels/allocator.hpp"
#include "areal/kernels/blas_probe.hpp"
#include "areal/runtime/blas_core.hpp"
#include "areal/runtime/certs.hpp"
#include "areal/runtime/cli.hpp"
#include "areal/runtime/cpus.hpp"
#include "areal/runtime/failpoints.hpp"
#include "areal/runtime/files.hpp"
#include "areal/runtime/log.hpp"
#include "areal/runtime/report.hpp"
#include "areal/runtime/run_directory.hpp"
#include "areal/sim/replay.hpp"
#include "areal/sim/simulate_command.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view{argv[1]} == "report")  // reads files and writes a page: no BLAS, no actors
    return areal::report::report_command({argv + 2, argv + argc}, std::cout, std::cerr);
  areal::fit_blas_core(argc, argv);  // first: it may execute areal again with OpenBLAS's right kernels
  areal::kernels::tune_allocator();
  auto cli = areal::parse_cli(argc, argv);
  if (!cli.options) {
    std::cerr << "areal: " << cli.error << "\n";
    return areal::exit_bad_input;
  }
  auto& options = *cli.options;
  if (options.help) {
    std::cout << areal::usage();
    return areal::exit_ok;
  }
  if (options.help_config) {
    std::cout << areal::describe_config_schema();
    return areal::exit_ok;
  }
  if (options.version) {
    std::cout << "areal " << AREAL_VERSION << " (protocol " << areal::protocol_version << ", schema "
              << areal::schema_version << ")\n";
    // What this build can move weights with: one built against a LibTorch without Gloo's headers (PyTorch's)
    // has no Gloo link; NCCL needs the build's NCCL and a GPU here.
    using areal::weight_backend;
    std::cout << "weight links: caf, gloo"
              << (areal::weight_backend_available(weight_backend::gloo)
                      ? ""
                      : " (not in this build: Gloo's headers were not found when it was configured)")
              << ", nccl"
              << (areal::weight_backend_available(weight_backend::nccl)
                      ? ""
                      : " (not usable here: this build has no NCCL, or this machine no GPU)")
              << "\n";
    return areal::exit_ok;
  }
  if (options.blas) {
    auto facts = areal::kernels::probe_blas();
    std::cout << areal::kernels::describe(facts) << "\n";
    if (auto& core = areal::blas_core(); !core.warning.empty())
      std::cout << "warning: " << core.warning << "\n";
    std::cout << "fp32 matrix product 512x512x512: " << static_cast<int>(areal::kernels::measure_gemm_gflops())
              << " GFLOP/s\n";
    return areal::blas_core().core.empty() || areal::blas_core().check_passed ? areal::exit_ok : areal::exit_failure;
  }

  auto loaded = areal::load_config(options.config_path, options.overrides);
  if (!loaded.config) {
    for (auto& e : loaded.errors)
      std::cerr << "areal: " << e << "\n";
    std::cerr << "areal: " << loaded.errors.size() << " configuration error(s); nothing was started\n";
    return areal::exit_bad_input;
  }
  auto& config = *loaded.config;
  if (options.simulate && !options.replay_dir.empty())
    return areal::sim::replay_command(config, options.replay_dir, options.overrides, std::cout, std::cerr);
  if (options.simulate)
    return areal::sim::simulate_command(config, std::cout, std::cerr);
  if (options.make_certs) {
    try {
      for (auto& file : areal::make_cluster_certificates(config, config.cluster.certs_dir))
        std::cout << "wrote " << file << "\n";
      std::cout << "copy " << config.cluster.certs_dir
                << " to every host (each node needs ca.pem and its own NODE.pem and NODE.key; keep ca.key "
                   "private)\n";
      return areal::exit_ok;
    } catch (const std::exception& e) {
      std::cerr << "areal: --make-certs: " << e.what() << "\n";
      return areal::exit_failure;
    }
  }
  auto choice = areal::choose_node(config, options);
  if (!choice.node) {
    std::cerr << "areal: " << choice.error << "\n";
    return areal::exit_bad_input;
  }
  auto& node = *choice.node;
  areal::log::init(node.name, options.log_level);
  if (auto wrong = areal::failpoints::configure_from_environment(); !wrong.empty()) {
    std::cerr << "areal: " << wrong << "\n";
    return areal::exit_bad_input;
  }
  if (auto on = areal::failpoints::describe_active(); !on.empty())
    spdlog::warn("failpoints on (AREAL_FAILPOINTS): {}; this process injects faults, for chaos testing only", on);
  // Peers must be nodes of the topology: an RL run whose topology lacks a role would wait for it forever.
  if (!config.run.probe_only)
    for (auto needed : {areal::role::rollout, areal::role::reward}) {
      bool somewhere = node.has(needed);  // with --role applied
      for (auto& n : config.nodes)
        somewhere = somewhere || n.has(needed);
      if (!somewhere) {
        std::cerr << "areal: " << config.source << ": no node has the role \"" << areal::to_string(needed)
                  << "\", and an RL run needs one (only nodes of the topology can join); add it to a node's roles\n";
        return areal::exit_bad_input;
      }
    }

  // The run directory is this process's before anything is written into it:
  // locked for the process's life, and a run found there is continued
  // (--resume), moved aside (--fresh) or left alone.
  fs::path run_dir = options.run_dir ? fs::path{*options.run_dir} : fs::path{config.run.output_dir} / config.run.name;
  bool runs_job = areal::runs_rl_job(config, node);
  areal::run_directory taken;
  try {
    taken = areal::open_run_directory({run_dir, node.name, runs_job, options.resume, options.fresh});
  } catch (const areal::file_error& e) {
    spdlog::error("{}", e.what());
    return areal::exit_bad_input;
  }
  if (!taken.moved_aside.empty())
    spdlog::info("--fresh: the previous run was moved to {}", taken.moved_aside.string());
  auto resolved = run_dir / (node.has(areal::role::controller) ? "config.toml" : "config." + node.name + ".toml");
  try {
    areal::write_file_atomically(resolved, config.resolved_toml);
  } catch (const areal::file_error& e) {
    spdlog::error("{}; choose a writable place with --run-dir or run.output_dir", e.what());
    return areal::exit_bad_input;
  }

  spdlog::info("areal {} node {} (roles {}), pid {}, run \"{}\" in {}", AREAL_VERSION, node.name,
               areal::join(node.roles), getpid(), config.run.name, run_dir.string());
  spdlog::info("resolved configuration written to {}", resolved.string());
  auto facts = areal::kernels::probe_blas();
  spdlog::info("{}", areal::kernels::describe(facts));
  auto& budget = areal::cpus();
  spdlog::info("{} compute thread(s) on {}", node.compute_threads, budget.describe());
  if (auto w = areal::oversubscription_warning(node.name, static_cast<int>(node.compute_threads), budget); !w.empty())
    spdlog::warn("{}", w);
  if (runs_job)  // the machine facts the report shows beside the run's figures
    try {
      auto& core = areal::blas_core();
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      nlohmann::json machine = {{"areal", AREAL_VERSION},
                                {"host", host},
                                {"hardware_threads", std::thread::hardware_concurrency()},
                                {"usable_cpus", budget.usable()},
                                {"cpus", budget.describe()},
                                {"compute_threads", node.compute_threads},
                                {"intra_op_threads", facts.intra_op_threads},
                                {"blas", facts.library},
                                {"openblas_core", core.core.empty() ? "none" : core.core + " (" + core.how + ")"},
                                {"libtorch", facts.torch_version}};
      areal::write_file_atomically(run_dir / "machine.json", machine.dump(2) + "\n");
    } catch (const areal::file_error& e) {
      spdlog::warn("{}: the report will not show the machine facts", e.what());
    }
  if (auto& core = areal::blas_core(); !core.warning.empty())
    spdlog::warn("{}", core.warning);
  if (facts.reference_blas)
    spdlog::warn("LibTorch runs on the reference BLAS, about 16x slower: install libopenblas0-openmp (setup.sh does)");

  if (config.nodes.size() > 1 && config.cluster.tls) {
    if (auto missing = areal::check_tls_files(config, node.name); !missing.empty()) {
      spdlog::error("{}", missing);
      return areal::exit_bad_input;
    }
    if (config.cluster.weight_transport == "gloo")
      spdlog::info(
          "mutual TLS on between nodes; bulk weights travel over Gloo links, which are not encrypted "
          "(set cluster.weight_transport = \"caf\" to send them over the TLS connections)");
  } else if (config.nodes.size() > 1) {
    spdlog::warn("cluster.security = \"plain\": peers are not authenticated and traffic is not encrypted");
  }
  areal::node_run_options run_options;
  run_options.run_dir = run_dir.string();
  run_options.resume = options.resume;
  try {
    return areal::run_node(config, node, run_options);
  } catch (const std::exception& e) {
    spdlog::error("the node failed: {}", e.what());
    return areal::exit_failure;
  }
}
