// The command line of the areal program: its flags, their checks and --help (see cli.hpp).
#include "areal/runtime/cli.hpp"

#include <algorithm>
#include <filesystem>
#include <string_view>

namespace areal {

std::string usage() {
  return R"(usage: areal --config FILE [--node NAME] [--role ROLE[,ROLE...]] [--set KEY=VALUE]...
             [--run-dir DIR] [--resume | --fresh] [--log-level LEVEL]
       areal --config FILE --make-certs
       areal simulate --config FILE [--set KEY=VALUE]...
       areal simulate --replay RUN_DIR [--set KEY=VALUE]...
       areal report RUN_DIR... [--bench FILE.json]... [--out FILE]
       areal --help | --help-config | --version | --blas

Runs one node of an areal topology: one CAF actor system per process.
  --config FILE     run configuration and topology (TOML); see configs/
  --node NAME       which [[nodes]] entry this process is (needed when there are several)
  --role ROLES      roles to run, comma-separated: controller, trainer, rollout, reward;
                    with --node it replaces that node's roles, alone it picks the node with these roles
  --set KEY=VALUE   override any key, e.g. --set run.hold_s=5 --set nodes.worker.port=7101
  --run-dir DIR     where outputs go (default: run.output_dir/run.name)
  --resume          continue the run from the checkpoint in its run directory
  --fresh           start a new run where one exists already: the old run directory is moved aside
                    (to DIR.replaced-TIME); without --resume or --fresh an existing run is not touched
  --log-level L     trace, debug, info (default), warn, error
  --make-certs      write a private CA and a certificate for every node of the topology into
                    cluster.certs_dir (for cluster.security = "tls"; an existing CA is kept), then exit
  --help-config     list every configuration key with its type, range and default
  simulate          run the configuration in virtual time with simulated GPU members instead (the real
                    controller; see the [simulate] section of --help-config); prints its figures and exits
  --replay RUN_DIR  (with simulate) replay a finished run in virtual time: its configuration, its costs fitted
                    to its trace, its recorded schedule beside the replayed one; --set makes it a what-if
  report            draw runs (overlaid) and benchmark JSON files into one self-contained HTML page
                    (default report.html); run.dashboard_port serves the same page live during a run
  --blas            print the BLAS LibTorch calls, the OpenBLAS kernels it runs and how they were chosen
                    (AREAL_BLAS_CORE=auto|fit|keep; see README), with a checked product's rate, then exit
Exit codes: 0 run finished or stopped by a signal (a checkpoint is written), 2 bad command line or configuration,
            3 could not reach a peer, 4 lost the controller, 5 refused by a peer, 1 other failure.
)";
}

cli_result parse_cli(int argc, const char* const* argv) {
  cli_options o;
  auto fail = [](std::string text) {
    return cli_result{std::nullopt, std::move(text) + "\n(run areal --help for usage)"};
  };
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string inline_value;
    bool has_inline = false;
    if (arg.substr(0, 2) == "--") {
      // --name=value form (the first '=' splits, so --set=a.b=1 works too).
      if (auto eq = arg.find('='); eq != std::string_view::npos) {
        inline_value = std::string{arg.substr(eq + 1)};
        arg = arg.substr(0, eq);
        has_inline = true;
      }
    }
    auto value = [&](std::string& out) -> bool {
      if (has_inline) {
        out = inline_value;
        return true;
      }
      if (i + 1 >= argc)
        return false;
      out = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "simulate" && i == 1) {
      o.simulate = true;
    } else if (arg == "--help" || arg == "-h") {
      o.help = true;
    } else if (arg == "--help-config") {
      o.help_config = true;
    } else if (arg == "--version") {
      o.version = true;
    } else if (arg == "--blas") {
      o.blas = true;
    } else if (arg == "--config") {
      if (!value(v))
        return fail("--config needs a file path");
      o.config_path = v;
    } else if (arg == "--replay") {
      if (!value(v) || v.empty())
        return fail("--replay needs a finished run's directory");
      o.replay_dir = v;
    } else if (arg == "--node") {
      if (!value(v) || v.empty())
        return fail("--node needs a node name from the topology");
      o.node = v;
    } else if (arg == "--role") {
      if (!value(v))
        return fail("--role needs roles, e.g. --role rollout,reward");
      std::string bad;
      auto roles = parse_roles(v, &bad);
      if (!roles)
        return fail("--role: unknown role \"" + bad + "\"; use controller, trainer, rollout or reward");
      o.roles = *roles;
    } else if (arg == "--set") {
      if (!value(v) || v.find('=') == std::string::npos)
        return fail("--set needs KEY=VALUE, e.g. --set run.hold_s=5");
      o.overrides.push_back(v);
    } else if (arg == "--run-dir") {
      if (!value(v) || v.empty())
        return fail("--run-dir needs a directory");
      o.run_dir = v;
    } else if (arg == "--make-certs") {
      o.make_certs = true;
    } else if (arg == "--resume") {
      o.resume = true;
    } else if (arg == "--fresh") {
      o.fresh = true;
    } else if (arg == "--log-level") {
      if (!value(v) || (v != "trace" && v != "debug" && v != "info" && v != "warn" && v != "error"))
        return fail("--log-level needs one of trace, debug, info, warn, error");
      o.log_level = v;
    } else {
      return fail("unknown argument \"" + std::string{argv[i]} + "\"");
    }
  }
  if (!o.replay_dir.empty()) {
    if (!o.simulate)
      return fail("--replay goes with simulate: areal simulate --replay RUN_DIR");
    if (!o.config_path.empty())
      return fail("--replay reads the run's own config.toml: leave out --config (change keys with --set)");
    o.config_path = (std::filesystem::path(o.replay_dir) / "config.toml").string();
  }
  if (o.resume && o.fresh)
    return fail("--resume continues the run, --fresh replaces it: pass one of them");
  if (o.config_path.empty() && !o.help && !o.help_config && !o.version && !o.blas)
    return fail("missing --config FILE (the single-node default is configs/single_node.toml)");
  return {o, {}};
}

node_choice choose_node(const run_config& config, const cli_options& options) {
  auto names = [&] {
    std::string out;
    for (auto& n : config.nodes)
      out += (out.empty() ? "" : ", ") + n.name;
    return out;
  };
  std::optional<node_spec> chosen;
  if (options.node) {
    if (auto* n = config.find_node(*options.node))
      chosen = *n;
    else
      return {std::nullopt,
              "--node " + *options.node + ": no such node in " + config.source + "; its nodes are: " + names()};
  } else if (config.nodes.size() == 1) {
    chosen = config.nodes.front();
  } else if (options.roles) {
    auto wanted = *options.roles;
    std::sort(wanted.begin(), wanted.end());
    for (auto& n : config.nodes) {
      auto have = n.roles;
      std::sort(have.begin(), have.end());
      if (have == wanted) {
        if (chosen)
          return {std::nullopt, "--role " + join(*options.roles) + " matches several nodes (" + chosen->name + ", " +
                                    n.name + "); pass --node NAME"};
        chosen = n;
      }
    }
    if (!chosen)
      return {std::nullopt, "--role " + join(*options.roles) + ": no node of " + config.source +
                                " has exactly these roles; pass --node NAME (one of: " + names() + ")"};
  } else {
    return {std::nullopt, config.source + " has " + std::to_string(config.nodes.size()) +
                              " nodes; pass --node NAME (one of: " + names() + ")"};
  }
  if (options.roles && options.node) {
    bool had_controller = chosen->has(role::controller);
    chosen->roles = *options.roles;
    if (had_controller != chosen->has(role::controller))
      return {std::nullopt, "--role " + join(*options.roles) + ": the controller role is fixed by the topology (node " +
                                config.controller_node().name + "); change it in " + config.source};
  }
  return {chosen, {}};
}

}  // namespace areal
