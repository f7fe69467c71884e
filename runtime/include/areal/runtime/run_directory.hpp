// A run directory taken by one process before it writes anything: its lock,
// and for the process that runs the job, no new run over an existing one
// unless asked (--fresh moves the old one aside).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "areal/runtime/files.hpp"

namespace areal {

struct run_directory_request {
  std::filesystem::path directory;
  std::string node;       // this process's node of the topology
  bool runs_job = false;  // the process that runs the job (it writes metrics, checkpoints, the summary)
  bool resume = false;    // --resume: the run there is continued
  bool fresh = false;     // --fresh: a run there is moved aside first
};

struct run_directory {
  run_lock lock;
  std::filesystem::path moved_aside;  // where --fresh put the previous run; empty when nothing moved
};

/// The lock file of a node's process in its run directory: "run.lock" for the
/// job's process, "run.NODE.lock" for the others (several nodes may share a directory).
std::string lock_file_name(const std::string& node, bool runs_job);

/// The outputs of a run found in `directory` (metrics.jsonl, checkpoint/, summary.json); empty when none.
std::vector<std::string> run_outputs(const std::filesystem::path& directory);

/// Takes the run directory for this process. Throws file_error saying what to
/// do when another process holds it, or when a run is there and neither
/// `resume` nor `fresh` is set.
run_directory open_run_directory(const run_directory_request& request);

}  // namespace areal
