// The CPU budget (runtime/include/areal/runtime/cpus.hpp): cgroup quotas found
// through a process's cgroup paths and the mount table, on fake hierarchies in
// a folder of the test's own; and the warning for a node set to more compute
// threads than it may use.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "areal/runtime/cpus.hpp"

using namespace areal;
namespace fs = std::filesystem;

namespace {

struct fake_hierarchy {
  fs::path root;
  fake_hierarchy() {
    root = fs::temp_directory_path() / ("areal_test_cpus_" + std::to_string(::getpid()));
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~fake_hierarchy() { fs::remove_all(root); }
  void write(const std::string& relative, const std::string& text) const {
    auto p = root / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  // A mountinfo line for a hierarchy of `type` whose `hierarchy_root` is mounted at root/`at`.
  std::string mount_line(const std::string& type, const std::string& at, const std::string& hierarchy_root = "/",
                         const std::string& options = "rw") const {
    return "30 23 0:26 " + hierarchy_root + " " + (root / at).string() + " rw,nosuid - " + type + " " + type + " " +
           options + "\n";
  }
};

}  // namespace

TEST_CASE("a cgroup v2 quota is the smallest cpu.max on the path from the process's cgroup to the mount") {
  fake_hierarchy h;
  auto mounts = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n" + h.mount_line("cgroup2", "unified");
  h.write("unified/job/cpu.max", "150000 100000");
  h.write("unified/job/step/cpu.max", "max 100000");
  auto q = cgroup_cpu_quota("0::/job/step\n", mounts);
  REQUIRE(q);
  CHECK(q->cpus == doctest::Approx(1.5));
  CHECK(q->file == (h.root / "unified/job/cpu.max").string());

  // A tighter limit below wins; a looser one above does not.
  h.write("unified/job/step/cpu.max", "300000 100000");
  h.write("unified/cpu.max", "400000 100000");
  q = cgroup_cpu_quota("0::/job/step\n", mounts);
  REQUIRE(q);
  CHECK(q->cpus == doctest::Approx(1.5));
  h.write("unified/job/step/cpu.max", "100000 100000");
  q = cgroup_cpu_quota("0::/job/step\n", mounts);
  REQUIRE(q);
  CHECK(q->cpus == doctest::Approx(1.0));

  // No limit anywhere ("max"), or no cpu.max at all (the cpu controller not enabled).
  h.write("unified/job/step/cpu.max", "max 100000");
  h.write("unified/job/cpu.max", "max 100000");
  h.write("unified/cpu.max", "max 100000");
  CHECK_FALSE(cgroup_cpu_quota("0::/job/step\n", mounts));
  CHECK_FALSE(cgroup_cpu_quota("0::/elsewhere\n", mounts));
}

TEST_CASE("a cgroup v1 quota comes from the hierarchy holding the cpu controller, not cpuset") {
  fake_hierarchy h;
  auto mounts = h.mount_line("cgroup", "cpuset", "/", "rw,cpuset") +
                h.mount_line("cgroup", "cpu", "/", "rw,cpu,cpuacct") + h.mount_line("cgroup2", "unified");
  auto self = "9:name=systemd:/\n3:cpuset:/batch\n2:cpu,cpuacct:/batch/job\n0::/\n";
  h.write("cpuset/batch/cpu.cfs_quota_us", "100000");  // never read: not the cpu hierarchy
  h.write("cpuset/batch/cpu.cfs_period_us", "100000");
  h.write("cpu/batch/job/cpu.cfs_quota_us", "-1");
  h.write("cpu/batch/job/cpu.cfs_period_us", "100000");
  h.write("cpu/batch/cpu.cfs_quota_us", "250000");
  h.write("cpu/batch/cpu.cfs_period_us", "100000");
  auto q = cgroup_cpu_quota(self, mounts);
  REQUIRE(q);
  CHECK(q->cpus == doctest::Approx(2.5));
  CHECK(q->file == (h.root / "cpu/batch/cpu.cfs_quota_us").string());
  h.write("cpu/batch/cpu.cfs_quota_us", "-1");
  CHECK_FALSE(cgroup_cpu_quota(self, mounts));
}

TEST_CASE("a container's hierarchy mounted from a sub-folder, and a mount point with a space") {
  fake_hierarchy h;
  // mountinfo writes the space as \040.
  auto mounts = h.mount_line("cgroup2", "with\\040space", "/kubepods/pod1");
  h.write("with space/cpu.max", "50000 100000");
  auto q = cgroup_cpu_quota("0::/kubepods/pod1/container\n", mounts);
  REQUIRE(q);
  CHECK(q->cpus == doctest::Approx(0.5));
  CHECK(q->file == (h.root / "with space/cpu.max").string());
  h.write("with space/container/cpu.max", "20000 100000");
  q = cgroup_cpu_quota("0::/kubepods/pod1/container\n", mounts);
  REQUIRE(q);
  CHECK(q->cpus == doctest::Approx(0.2));
  // Lines that are not what they should be are passed over, a backslash that starts no escape kept.
  CHECK_FALSE(cgroup_cpu_quota("garbage\n0:x\n", "garbage\n1 2 3\n"));
  h.write("back\\9slash/cpu.max", "30000 100000");
  q = cgroup_cpu_quota("0::/\n", h.mount_line("cgroup2", "back\\9slash"));
  REQUIRE(q);
  CHECK(q->cpus == doctest::Approx(0.3));
}

TEST_CASE("usable CPUs: the affinity, cut by the quota's whole CPUs, at least one, and the oversubscription warning") {
  cpu_budget b;
  b.online = 8;
  b.affinity = 4;
  CHECK(b.usable() == 4);
  CHECK(b.describe() == "4 usable CPUs (8 online, affinity 4, no cgroup CPU quota)");
  b.quota = cpu_quota{2.5, "/sys/fs/cgroup/job/cpu.max"};
  CHECK(b.usable() == 2);
  CHECK(b.describe() == "2 usable CPUs (8 online, affinity 4, cgroup CPU quota 2.5 (/sys/fs/cgroup/job/cpu.max))");
  b.quota->cpus = 0.5;
  CHECK(b.usable() == 1);

  b.quota->cpus = 2;
  CHECK(oversubscription_warning("local", 2, b).empty());
  auto w = oversubscription_warning("local", 3, b);
  CHECK(w.find("nodes.local.compute_threads = 3") != std::string::npos);
  CHECK(w.find("set compute_threads to 2 or fewer") != std::string::npos);

  // This process: between one and the online CPUs.
  auto& here = cpus();
  CHECK(here.usable() >= 1);
  CHECK(here.usable() <= here.online);
  CHECK(here.affinity <= here.online);
}
