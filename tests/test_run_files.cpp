// The run's files on their own: atomic replacement that keeps the old file on
// failure, append-only records cut back after a failed write (a file size
// limit stands in for a full disk), the run lock naming its holder, and the
// run directory refusing a new run over an old one unless --fresh moves it aside.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "areal/runtime/files.hpp"
#include "areal/runtime/run_directory.hpp"
#include "node_process.hpp"

namespace fs = std::filesystem;
using namespace areal;
using areal::test::read_text;
using areal::test::scratch_dir;

namespace {

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Writes past `bytes` fail with EFBIG (SIGXFSZ ignored) while this lives.
struct file_size_limit {
  rlimit before{};
  explicit file_size_limit(rlim_t bytes) {
    signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &before);
    rlimit limit{bytes, before.rlim_max};
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~file_size_limit() {
    setrlimit(RLIMIT_FSIZE, &before);
    signal(SIGXFSZ, SIG_DFL);
  }
};

}  // namespace

TEST_CASE("a file replaced atomically is whole, and a failed replacement keeps the old one and no temporary") {
  scratch_dir dir{"atomic"};
  auto path = dir.path / "summary.json";
  write_file_atomically(path, "first\n");
  write_file_atomically(path, std::vector<std::string_view>{"sec", "ond\n"});
  CHECK(read_text(path) == "second\n");
  {
    file_size_limit limit{1000};
    CHECK_THROWS_WITH_AS(write_file_atomically(path, std::string(5000, 'x')),
                         doctest::Contains("summary.json: cannot write"), file_error);
  }
  CHECK(read_text(path) == "second\n");
  CHECK(names_in(dir.path) == std::vector<std::string>{"summary.json"});
  CHECK(is_temporary_file("summary.json.tmp.1234"));
  CHECK_FALSE(is_temporary_file("summary.json"));
  CHECK_FALSE(is_temporary_file("a.tmp.x1"));
}

TEST_CASE("an append that fails part-way is cut back, so the file ends on a whole record") {
  scratch_dir dir{"append"};
  auto path = dir.path / "metrics.jsonl";
  append_only_file log(path);
  log.append("{\"step\":1}\n");
  log.sync();
  CHECK(log.size() == 11);
  {
    file_size_limit limit{40};
    log.append("{\"step\":2}\n");  // 22 bytes: fits
    // 30 more bytes: 18 of them fit before the limit, so the write stops part-way.
    CHECK_THROWS_WITH_AS(log.append("{\"step\":3,\"pad\":\"xxxxxxxxxx\"}\n"),
                         doctest::Contains("metrics.jsonl: cannot append"), file_error);
  }
  CHECK(read_text(path) == "{\"step\":1}\n{\"step\":2}\n");
  CHECK(log.size() == 22);
  log.append("{\"step\":3}\n");
  CHECK(read_text(path) == "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
  truncate_file(path, 11);
  CHECK(read_text(path) == "{\"step\":1}\n");
  truncate_file(path, 1000);  // longer than the file: left alone
  CHECK(read_text(path) == "{\"step\":1}\n");
}

TEST_CASE("the run lock is one process's and names it to the next") {
  scratch_dir dir{"lock"};
  auto lock = run_lock::acquire(dir.path / "run", "run.lock");
  CHECK(lock.held());
  // flock locks belong to an open file: a second open in this process conflicts like another process.
  try {
    run_lock::acquire(dir.path / "run", "run.lock");
    FAIL("a second lock was granted");
  } catch (const lock_held_error& e) {
    CHECK(std::string{e.what()}.find("is in use by pid " + std::to_string(getpid()) + " on host ") !=
          std::string::npos);
  }
  lock = run_lock{};  // released
  CHECK(run_lock::acquire(dir.path / "run", "run.lock").held());
}

TEST_CASE("a run directory with a run in it is refused without --resume, continued with it, moved aside by --fresh") {
  scratch_dir dir{"rundir"};
  auto run = dir.path / "r";
  run_directory_request request{run, "local", true, false, false};
  {
    auto taken = open_run_directory(request);  // a new directory
    CHECK(taken.lock.held());
    CHECK(taken.moved_aside.empty());
  }
  std::ofstream(run / "metrics.jsonl") << "{\"event\":\"step\",\"step\":1}\n";
  fs::create_directories(run / "checkpoint");
  CHECK(run_outputs(run) == std::vector<std::string>{"metrics.jsonl", "checkpoint/"});
  CHECK_THROWS_WITH_AS(open_run_directory(request),
                       doctest::Contains("holds a run already (metrics.jsonl, checkpoint/); continue it with --resume"),
                       file_error);
  CHECK(fs::exists(run / "metrics.jsonl"));  // untouched
  {
    auto resume = request;
    resume.resume = true;
    CHECK(open_run_directory(resume).lock.held());
  }
  {
    // While the run's process holds the lock, even --fresh leaves it alone.
    auto running = run_lock::acquire(run, "run.lock");
    auto fresh = request;
    fresh.fresh = true;
    CHECK_THROWS_AS(open_run_directory(fresh), lock_held_error);
    CHECK(fs::exists(run / "metrics.jsonl"));
  }
  auto fresh = request;
  fresh.fresh = true;
  auto taken = open_run_directory(fresh);
  REQUIRE_FALSE(taken.moved_aside.empty());
  CHECK(taken.moved_aside.filename().string().rfind("r.replaced-", 0) == 0);
  CHECK(fs::exists(taken.moved_aside / "metrics.jsonl"));
  CHECK(run_outputs(run).empty());
  // Other nodes of a topology share the directory: their locks are their own, and they never refuse a run.
  run_directory_request worker{run, "worker", false, false, false};
  CHECK(open_run_directory(worker).lock.held());
  CHECK(lock_file_name("worker", false) == "run.worker.lock");
}
