#include "areal/runtime/cpus.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace areal {

namespace {

std::vector<std::string> split(std::string_view text, char by) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    auto end = text.find(by, start);
    out.emplace_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos)
      return out;
    start = end + 1;
  }
}

bool contains(const std::vector<std::string>& list, const std::string& x) {
  return std::find(list.begin(), list.end(), x) != list.end();
}

// mountinfo writes a space, tab, newline or backslash in a path as \ooo (octal).
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    auto octal = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '7'; };
    if (s[i] == '\\' && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::optional<std::string> read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line))
    return std::nullopt;
  return line;
}

std::optional<double> number(const std::string& s) {
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    if (used == s.size() && std::isfinite(v))
      return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// QUOTA / PERIOD read from `file`; none for a limit that is not one ("max", -1) or text that is not numbers.
std::optional<cpu_quota> quota_of(const std::string& quota, const std::string& period, const std::string& file) {
  auto q = number(quota), p = number(period);
  if (!q || !p || *q <= 0 || *p <= 0)
    return std::nullopt;
  return cpu_quota{*q / *p, file};
}

// The quota a cgroup folder sets itself (cgroup v2: cpu.max "QUOTA PERIOD" or "max PERIOD").
std::optional<cpu_quota> quota_v2(const std::string& dir) {
  auto file = dir + "/cpu.max";
  auto line = read_first_line(file);
  if (!line)
    return std::nullopt;
  std::istringstream in(*line);
  std::string quota, period;
  in >> quota >> period;
  return quota_of(quota, period, file);
}

// cgroup v1: cpu.cfs_quota_us (-1: no limit) over cpu.cfs_period_us.
std::optional<cpu_quota> quota_v1(const std::string& dir) {
  auto file = dir + "/cpu.cfs_quota_us";
  auto quota = read_first_line(file);
  auto period = read_first_line(dir + "/cpu.cfs_period_us");
  if (!quota || !period)
    return std::nullopt;
  return quota_of(*quota, *period, file);
}

// `best` becomes `q` when q is a tighter limit.
void keep_smaller(std::optional<cpu_quota>& best, const std::optional<cpu_quota>& q) {
  if (q && (!best || q->cpus < best->cpus))
    best = q;
}

struct mount {
  std::string root, point;
};

// The folder of the process's cgroup `path` under a hierarchy mounted at `m`.
std::string folder_of(const mount& m, const std::string& path) {
  if (m.root == "/")
    return m.point + (path == "/" ? "" : path);
  if (path.compare(0, m.root.size(), m.root) == 0 && (path.size() == m.root.size() || path[m.root.size()] == '/'))
    return m.point + path.substr(m.root.size());
  return m.point;  // the process's cgroup is outside what is mounted (a namespace): the mount's own limit
}

// The smallest quota from `dir` up to the mount point `top`.
std::optional<cpu_quota> smallest_on_path(std::string dir, const std::string& top, bool v2) {
  std::optional<cpu_quota> best;
  for (;;) {
    keep_smaller(best, v2 ? quota_v2(dir) : quota_v1(dir));
    if (dir.size() <= top.size())
      return best;
    auto slash = dir.rfind('/');
    if (slash == std::string::npos || slash < top.size())
      dir = top;
    else
      dir = dir.substr(0, slash);
  }
}

std::string whole_file(const char* path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

cpu_budget probe() {
  cpu_budget b;
  b.online = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  b.affinity = b.online;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    b.affinity = std::max(1, CPU_COUNT(&set));
  b.quota = cgroup_cpu_quota(whole_file("/proc/self/cgroup"), whole_file("/proc/self/mountinfo"));
  return b;
}

}  // namespace

std::optional<cpu_quota> cgroup_cpu_quota(std::string_view self_cgroup, std::string_view mountinfo) {
  // The process's path in the v2 hierarchy and in the v1 hierarchy that holds the cpu controller.
  std::optional<std::string> path_v2, path_v1;
  for (auto& line : split(self_cgroup, '\n')) {
    auto first = line.find(':');
    auto second = first == std::string::npos ? std::string::npos : line.find(':', first + 1);
    if (second == std::string::npos)
      continue;
    auto controllers = line.substr(first + 1, second - first - 1);
    auto path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty())
      path_v2 = path;
    else if (contains(split(controllers, ','), "cpu"))
      path_v1 = path;
  }
  std::optional<cpu_quota> best;
  for (auto& line : split(mountinfo, '\n')) {
    std::istringstream in(line);
    std::vector<std::string> fields;
    for (std::string f; in >> f;)
      fields.push_back(f);
    auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || dash + 1 == fields.end())
      continue;
    mount m{unescape(fields[3]), unescape(fields[4])};
    auto type = *(dash + 1);
    if (type == "cgroup2" && path_v2) {
      keep_smaller(best, smallest_on_path(folder_of(m, *path_v2), m.point, true));
    } else if (type == "cgroup" && path_v1 && fields.end() - dash > 3 && contains(split(*(dash + 3), ','), "cpu")) {
      keep_smaller(best, smallest_on_path(folder_of(m, *path_v1), m.point, false));
    }
  }
  return best;
}

int cpu_budget::usable() const {
  int n = affinity;
  if (quota)
    n = std::min(n, static_cast<int>(std::floor(quota->cpus)));
  return std::max(1, n);
}

std::string cpu_budget::describe() const {
  std::ostringstream os;
  int n = usable();
  os << n << " usable CPU" << (n == 1 ? "" : "s") << " (" << online << " online, affinity " << affinity << ", ";
  if (quota)
    os << "cgroup CPU quota " << quota->cpus << " (" << quota->file << "))";
  else
    os << "no cgroup CPU quota)";
  return os.str();
}

const cpu_budget& cpus() {
  static const cpu_budget budget = probe();
  return budget;
}

std::string oversubscription_warning(const std::string& node, int threads, const cpu_budget& budget) {
  int usable = budget.usable();
  if (threads <= usable)
    return {};
  std::ostringstream os;
  os << "nodes." << node << ".compute_threads = " << threads << " exceeds this process's " << budget.describe()
     << ": its compute threads would time-share cores (the trainer's replicas, one per thread, wait for the "
        "slowest at every pass); set compute_threads to "
     << usable << " or fewer";
  return os.str();
}

}  // namespace areal
