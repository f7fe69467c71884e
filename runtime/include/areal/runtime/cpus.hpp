// How many CPUs this process may really use, for choosing and checking thread
// counts.
//
// std::thread::hardware_concurrency() counts the machine's online CPUs. A
// process may be allowed fewer: its CPU affinity (taskset, a cpuset cgroup, a
// batch scheduler's binding) and a cgroup CPU quota (a container's --cpus, a
// Kubernetes CPU limit, systemd's CPUQuota). Threads beyond that budget
// time-share cores; the trainer's data-parallel replicas, one per compute
// thread, then wait at every pass for the one that was preempted. The quota
// is the smallest one on the path from the process's cgroup to its
// hierarchy's mount (cgroup v2's cpu.max, or v1's cpu.cfs_quota_us over
// cpu.cfs_period_us), found through /proc/self/cgroup and /proc/self/mountinfo.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace areal {

struct cpu_quota {
  double cpus = 0;   // quota / period
  std::string file;  // where it was read
};

struct cpu_budget {
  int online = 1;                  // hardware_concurrency()
  int affinity = 1;                // CPUs in this process's affinity mask
  std::optional<cpu_quota> quota;  // none: no cgroup CPU limit found
  /// min(affinity, floor(quota)), at least 1: the compute threads that do not time-share a core.
  int usable() const;
  /// "2 usable CPUs (2 online, affinity 2, no cgroup CPU quota)", or with
  /// "cgroup CPU quota 1.5 (/sys/fs/cgroup/a/cpu.max)": for start-up lines and benchmarks' machine facts.
  std::string describe() const;
};

/// This process's budget, read once (the files do not change in a run that matters here).
const cpu_budget& cpus();

/// The smallest CPU quota on the path of this process's cgroup, from the text
/// of /proc/self/cgroup and /proc/self/mountinfo; the quota files are read
/// under the mount points mountinfo names (tests point them at a folder of
/// their own). None when no hierarchy with a CPU controller limits it.
std::optional<cpu_quota> cgroup_cpu_quota(std::string_view self_cgroup, std::string_view mountinfo);

/// A warning for a node set to `threads` compute threads beyond `budget`'s
/// usable CPUs (what is wrong and what to do), or empty when they fit.
std::string oversubscription_warning(const std::string& node, int threads, const cpu_budget& budget);

}  // namespace areal
