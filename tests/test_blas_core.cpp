// OpenBLAS's kernels fitted to the CPU (runtime/src/blas_core.cpp), run through
// `areal --blas` in child processes: a generic core is corrected (the program
// runs again with the right one, after a child checked its products), a core
// the user set is kept, and kernels that compute wrong are caught.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "areal/runtime/blas_core.hpp"
#include "node_process.hpp"

using namespace std::chrono_literals;

namespace {

struct outcome {
  int code;
  std::string output;
};

// `areal --blas` with `environment` (NAME=VALUE) set by env(1), and without the
// record of a correction this test program may carry itself.
outcome blas_line(const std::vector<std::string>& environment, const std::string& name,
                  const std::vector<std::string>& unset = {}) {
  areal::test::scratch_dir dir("blas-" + name);
  std::vector<std::string> args{"-u", "AREAL_BLAS_FIT"};
  for (auto& u : unset) {
    args.push_back("-u");
    args.push_back(u);
  }
  args.insert(args.end(), environment.begin(), environment.end());
  args.push_back(AREAL_BINARY);
  args.push_back("--blas");
  areal::test::node_process p(args, dir.path / "out.log", dir.path, "/usr/bin/env");
  REQUIRE(p.started());
  auto code = p.wait_exit(120s);
  REQUIRE(code.has_value());
  return {*code, p.log()};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a generic OpenBLAS core on a CPU that runs a better one is corrected, its products checked") {
  auto best = areal::best_blas_core_for_cpu();
  if (best.empty()) {
    MESSAGE("this CPU has no AVX: there is no better core to correct to");
    return;
  }
  // OPENBLAS_CORETYPE=Prescott loads the generic kernels, as Debian's OpenBLAS
  // detects them on a Sapphire Rapids Xeon; fit corrects even a core set so.
  auto r = blas_line({"OPENBLAS_CORETYPE=Prescott", "AREAL_BLAS_CORE=fit"}, "fit");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(contains(r.output, "core " + best + " (corrected from Prescott; products checked, error "));
  CHECK_FALSE(contains(r.output, "warning:"));
}

TEST_CASE("a core the user set is kept under the default policy, with a warning that names the fix") {
  if (areal::best_blas_core_for_cpu().empty())
    return;
  auto r = blas_line({"OPENBLAS_CORETYPE=Prescott"}, "auto", {"AREAL_BLAS_CORE"});
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(contains(r.output, "core Prescott (set by OPENBLAS_CORETYPE; this CPU supports"));
  CHECK(contains(r.output, "products checked"));
  CHECK(contains(r.output, "AREAL_BLAS_CORE=fit"));
  auto keep = blas_line({"OPENBLAS_CORETYPE=Prescott", "AREAL_BLAS_CORE=keep"}, "keep");
  CHECK(contains(keep.output, "core Prescott (set by OPENBLAS_CORETYPE"));
}

TEST_CASE("kernels that compute a known product wrong are reported, and no core that fails is chosen") {
  std::string wrong = "LD_PRELOAD=" WRONG_SGEMM_LIBRARY;
  auto kept = blas_line({wrong, "AREAL_BLAS_CORE=keep"}, "wrong-keep");
  INFO(kept.output);
  CHECK(kept.code == 1);
  CHECK(contains(kept.output, "products WRONG"));
  CHECK(contains(kept.output, "computed a known product wrong"));
  // Every candidate fails its check in the child too: the loaded core stays, and the warning says so.
  auto fit = blas_line({wrong, "OPENBLAS_CORETYPE=Prescott", "AREAL_BLAS_CORE=fit"}, "wrong-fit");
  INFO(fit.output);
  CHECK(fit.code == 1);
  CHECK(contains(fit.output, "core Prescott ("));
  CHECK(contains(fit.output, "no better core passed the check"));
}

TEST_CASE("an unknown policy is refused with the policies there are") {
  auto r = blas_line({"AREAL_BLAS_CORE=fastest"}, "bogus");
  CHECK(contains(r.output, "AREAL_BLAS_CORE=fastest is not a policy: use auto, fit or keep"));
}

TEST_CASE("a core name OpenBLAS does not take is reported as not taken, with the core it chose itself") {
  auto r = blas_line({"OPENBLAS_CORETYPE=NoSuchCore"}, "unknown-core", {"AREAL_BLAS_CORE"});
  CHECK_MESSAGE(contains(r.output, "(detected by OpenBLAS; OPENBLAS_CORETYPE=NoSuchCore was not taken"), r.output);
  CHECK_FALSE(contains(r.output, "set by OPENBLAS_CORETYPE"));
}
