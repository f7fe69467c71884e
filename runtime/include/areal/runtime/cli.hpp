// The node binary's command line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "areal/runtime/config.hpp"

namespace areal {

struct cli_options {
  std::string config_path;
  std::optional<std::string> node;         // --node NAME
  std::optional<std::vector<role>> roles;  // --role ROLE[,ROLE]
  std::vector<std::string> overrides;      // --set KEY=VALUE, in order
  std::optional<std::string> run_dir;      // --run-dir DIR
  bool resume = false;                     // --resume: continue from the run directory's checkpoint
  bool fresh = false;                      // --fresh: move an existing run aside and start anew
  std::string log_level = "info";
  bool help = false;
  bool help_config = false;
  bool version = false;
  bool blas = false;        // --blas: print the BLAS and its kernels, then exit
  bool simulate = false;    // areal simulate --config FILE: a virtual-time run ([simulate]), then exit
  std::string replay_dir;   // areal simulate --replay RUN_DIR: that run replayed in virtual time
  bool make_certs = false;  // --make-certs: write the topology's TLS certificates and exit
};

struct cli_result {
  std::optional<cli_options> options;
  std::string error;  // set when options is empty
};

cli_result parse_cli(int argc, const char* const* argv);
std::string usage();

/// Picks the node this process runs: --node, or the only node, or the node whose
/// roles equal --role. Applies --role to it. Returns an error text otherwise.
struct node_choice {
  std::optional<node_spec> node;
  std::string error;
};
node_choice choose_node(const run_config& config, const cli_options& options);

}  // namespace areal
