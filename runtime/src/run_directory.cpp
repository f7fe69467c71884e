// Taking a run directory (see run_directory.hpp).
#include "areal/runtime/run_directory.hpp"

#include <ctime>
#include <system_error>

namespace fs = std::filesystem;

namespace areal {

std::string lock_file_name(const std::string& node, bool runs_job) {
  return runs_job ? std::string{"run.lock"} : "run." + node + ".lock";
}

std::vector<std::string> run_outputs(const fs::path& directory) {
  std::vector<std::string> found;
  std::error_code ec;
  if (fs::file_size(directory / "metrics.jsonl", ec) > 0 && !ec)
    found.push_back("metrics.jsonl");
  for (auto name : {"checkpoint", "checkpoint.old", "checkpoint.new"})
    if (fs::exists(directory / name, ec)) {
      found.push_back(std::string{name} + "/");
      break;
    }
  if (fs::exists(directory / "summary.json", ec))
    found.push_back("summary.json");
  return found;
}

namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (auto& item : items)
    out += (out.empty() ? "" : ", ") + item;
  return out;
}

// A sibling name for the replaced run: DIR.replaced-YYYYmmdd-HHMMSS (with a counter when taken).
fs::path aside_name(const fs::path& directory) {
  auto now = std::time(nullptr);
  char stamp[32] = {};
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::gmtime(&now));
  auto base = directory.string();
  while (!base.empty() && base.back() == '/')
    base.pop_back();
  fs::path candidate = base + ".replaced-" + stamp;
  std::error_code ec;
  for (int i = 2; fs::exists(candidate, ec) && i < 1000; ++i)
    candidate = base + ".replaced-" + stamp + "-" + std::to_string(i);
  return candidate;
}

run_lock take(const fs::path& directory, const std::string& name) {
  try {
    return run_lock::acquire(directory, name);
  } catch (const lock_held_error& e) {
    throw lock_held_error(std::string{e.what()} +
                          ": stop that process first, or give this one another --run-dir or run.name");
  }
}

// Every process of the old run must be gone before it is moved: each lock file in it is taken once.
void check_no_process_uses(const fs::path& directory) {
  std::error_code ec;
  for (auto& entry : fs::directory_iterator(directory, ec)) {
    auto name = entry.path().filename().string();
    if (name.rfind("run.", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".lock")
      take(directory, name);  // throws naming the holder; released at once
  }
}

}  // namespace

run_directory open_run_directory(const run_directory_request& request) {
  run_directory out;
  auto& dir = request.directory;
  auto lock_name = lock_file_name(request.node, request.runs_job);
  std::error_code ec;
  if (request.runs_job && !request.resume && fs::exists(dir, ec)) {
    auto outputs = run_outputs(dir);
    if (!outputs.empty() && !request.fresh) {
      // Told before the lock is looked at: a run that is still going is named by the lock below.
      take(dir, lock_name);
      throw file_error(dir.string() + " holds a run already (" + joined(outputs) +
                       "); continue it with --resume, start anew with --fresh (the old run is moved aside to " +
                       aside_name(dir).filename().string() + "), or give this run another --run-dir or run.name");
    }
    if (!outputs.empty()) {
      check_no_process_uses(dir);
      auto aside = aside_name(dir);
      fs::rename(dir, aside, ec);
      if (ec)
        throw file_error(dir.string() + ": cannot move the previous run aside to " + aside.string() + ": " +
                         ec.message());
      out.moved_aside = aside;
    }
  }
  out.lock = take(dir, lock_name);
  return out;
}

}  // namespace areal
