#include "areal/runtime/blas_core.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cpuid.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern char** environ;

namespace areal {

namespace {

// Environment variables: the policy (the user's), the child's order to check a
// core, and the record a corrected process carries (so that it, and programs it
// starts, know the core was ours and do not correct again).
constexpr const char* policy_variable = "AREAL_BLAS_CORE";
constexpr const char* probe_variable = "AREAL_BLAS_PROBE";
constexpr const char* record_variable = "AREAL_BLAS_FIT";
constexpr const char* core_variable = "OPENBLAS_CORETYPE";

// A product element may differ from the exact sum by a few float roundings per
// term; wrong kernels give errors of order one.
constexpr double error_bound = 1e-4;
constexpr auto probe_deadline = std::chrono::seconds(60);

blas_core_state state;

// OpenBLAS's x86-64 core names by the instruction set their kernels need:
// 1 SSE, 2 AVX, 3 AVX2 + FMA, 4 AVX-512. Unknown names are left alone.
int core_level(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::array<const char*, 16> sse = {"katmai", "coppermine", "northwood", "prescott", "banias",
                                                  "atom",   "core2",      "penryn",    "dunnington", "nehalem",
                                                  "athlon", "opteron",    "opteron_sse3", "barcelona", "nano",
                                                  "bobcat"};
  for (auto n : sse)
    if (name == n)
      return 1;
  for (auto n : {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"})
    if (name == n)
      return 2;
  for (auto n : {"haswell", "zen"})
    if (name == n)
      return 3;
  for (auto n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (name == n)
      return 4;
  return 0;
}

const char* core_of_level(int level) {
  switch (level) {
    case 4: return "SkylakeX";
    case 3: return "Haswell";
    case 2: return "Sandybridge";
    default: return nullptr;
  }
}

// The instruction sets the CPU has and the operating system saves (XGETBV):
// a CPU flag alone is not enough for AVX or AVX-512 registers.
int cpu_level() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return 1;
  bool osxsave = c & bit_OSXSAVE, avx = c & bit_AVX, fma = c & bit_FMA;
  if (!osxsave || !avx)
    return 1;
  unsigned xcr0_low, xcr0_high;
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  if ((xcr0_low & 0x6) != 0x6)
    return 1;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
    return 2;
  bool avx2 = b & bit_AVX2;
  bool avx512 = (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) && (b & bit_AVX512DQ) &&
                (b & bit_AVX512CD) && (xcr0_low & 0xE0) == 0xE0;
  if (avx2 && fma)
    return avx512 ? 4 : 3;
  return 2;
}

using corename_fn = char* (*)();
using sgemm_fn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                          const int*, const float*, const int*, const float*, float*, const int*);
using sgemv_fn = void (*)(const char*, const int*, const int*, const float*, const float*, const int*, const float*,
                          const int*, const float*, float*, const int*);

std::string loaded_core() {
  auto name = reinterpret_cast<corename_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!name)
    return {};
  auto text = name();
  return text ? std::string(text) : std::string("Unknown");
}

std::vector<float> values(size_t count, uint32_t seed) {
  std::vector<float> v(count);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(seed >> 8) % 2001 - 1000) / 1000.0f;
  }
  return v;
}

// One product C = op(A) * op(B) (column-major, as BLAS), compared element by
// element with a double-precision sum; the error is scaled by sum |a||b|.
double check_gemm(sgemm_fn gemm, bool transpose_a, int m, int n, int k) {
  auto a = values(static_cast<size_t>(m) * k, 7u + m), b = values(static_cast<size_t>(k) * n, 11u + n);
  std::vector<float> c(static_cast<size_t>(m) * n, 0.0f);
  int lda = transpose_a ? k : m;
  float one = 1.0f, zero = 0.0f;
  char ta = transpose_a ? 'T' : 'N', tb = 'N';
  gemm(&ta, &tb, &m, &n, &k, &one, a.data(), &lda, b.data(), &k, &zero, c.data(), &m);
  double worst = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double sum = 0, scale = 1e-30;
      for (int p = 0; p < k; ++p) {
        double x = transpose_a ? a[static_cast<size_t>(i) * k + p] : a[static_cast<size_t>(p) * m + i];
        double y = b[static_cast<size_t>(j) * k + p];
        sum += x * y;
        scale += std::fabs(x * y);
      }
      double e = std::fabs(c[static_cast<size_t>(j) * m + i] - sum) / scale;
      worst = std::isfinite(e) ? std::max(worst, e) : 1e30;
    }
  return worst;
}

double check_gemv(sgemv_fn gemv, bool transpose, int m, int n) {
  auto a = values(static_cast<size_t>(m) * n, 13u), x = values(static_cast<size_t>(transpose ? m : n), 17u);
  int rows = transpose ? n : m;
  std::vector<float> y(static_cast<size_t>(rows), 0.0f);
  float one = 1.0f, zero = 0.0f;
  int inc = 1;
  char t = transpose ? 'T' : 'N';
  gemv(&t, &m, &n, &one, a.data(), &m, x.data(), &inc, &zero, y.data(), &inc);
  double worst = 0;
  for (int r = 0; r < rows; ++r) {
    double sum = 0, scale = 1e-30;
    for (int p = 0; p < (transpose ? m : n); ++p) {
      double av = transpose ? a[static_cast<size_t>(r) * m + p] : a[static_cast<size_t>(p) * m + r];
      sum += av * x[static_cast<size_t>(p)];
      scale += std::fabs(av * x[static_cast<size_t>(p)]);
    }
    double e = std::fabs(y[static_cast<size_t>(r)] - sum) / scale;
    worst = std::isfinite(e) ? std::max(worst, e) : 1e30;
  }
  return worst;
}

// The products the model runs, by shape class: odd edges, a size that takes
// OpenBLAS's threaded path, a transposed operand, and matrix-vector (decoding).
// The threaded path starts OpenMP's threads, which keep the signal mask they
// are born with: the termination signals are blocked meanwhile, so that they
// reach the thread a program waits for them on (areal's sigwait), never these.
double check_products() {
  sigset_t termination, before;
  sigemptyset(&termination);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    sigaddset(&termination, sig);
  pthread_sigmask(SIG_BLOCK, &termination, &before);
  struct restore {
    sigset_t* mask;
    ~restore() { pthread_sigmask(SIG_SETMASK, mask, nullptr); }
  } restore_mask{&before};
  auto gemm = reinterpret_cast<sgemm_fn>(dlsym(RTLD_DEFAULT, "sgemm_"));
  auto gemv = reinterpret_cast<sgemv_fn>(dlsym(RTLD_DEFAULT, "sgemv_"));
  if (!gemm || !gemv)
    return 1e30;
  double worst = check_gemm(gemm, false, 67, 45, 93);
  worst = std::max(worst, check_gemm(gemm, false, 256, 160, 192));
  worst = std::max(worst, check_gemm(gemm, true, 129, 64, 300));
  worst = std::max(worst, check_gemv(gemv, false, 301, 257));
  worst = std::max(worst, check_gemv(gemv, true, 301, 257));
  return worst;
}

std::string format_error(double e) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1e", e);
  return text;
}

std::string environment(const char* name) {
  auto v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The value of `key` in a record "from=Prescott;to=SkylakeX;error=3.1e-08".
std::string record_field(const std::string& record, const std::string& key) {
  auto at = (";" + record).find(";" + key + "=");
  if (at == std::string::npos)
    return {};
  auto start = at + key.size() + 1;
  auto end = record.find(';', start);
  return record.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// Starts this program with OPENBLAS_CORETYPE=core and the order to check its
// products; returns the error it reports, or a reason it gave none (a crash, a
// deadline).
std::pair<double, std::string> probe_core(const std::string& core, char** argv) {
  std::vector<std::string> owned;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "OPENBLAS_CORETYPE=", 18) != 0 && std::strncmp(*e, "AREAL_BLAS_PROBE=", 17) != 0)
      owned.emplace_back(*e);
  owned.push_back(std::string(core_variable) + "=" + core);
  owned.push_back(std::string(probe_variable) + "=1");
  std::vector<char*> envp;
  for (auto& s : owned)
    envp.push_back(s.data());
  envp.push_back(nullptr);

  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0)
    return {1e30, std::string("pipe: ") + std::strerror(errno)};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return {1e30, std::string("could not start the check: ") + std::strerror(rc)};
  }
  std::string reply;
  auto deadline = std::chrono::steady_clock::now() + probe_deadline;
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0)
      continue;
    char buffer[256];
    auto n = read(out[0], buffer, sizeof buffer);
    if (n <= 0)
      break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(out[0]);
  if (timed_out)
    kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return {1e30, "the check did not finish within " + std::to_string(probe_deadline.count()) + " s"};
  if (WIFSIGNALED(status))
    return {1e30, std::string("the check died of ") + strsignal(WTERMSIG(status))};
  auto error = record_field(reply, "error");
  if (error.empty())
    return {1e30, "the check gave no result (exit " + std::to_string(WEXITSTATUS(status)) + ")"};
  return {std::strtod(error.c_str(), nullptr), {}};
}

void describe_loaded() {
  if (!state.core.empty() || state.how == "no OpenBLAS")
    return;
  state.core = loaded_core();
  if (state.core.empty()) {
    state.how = "no OpenBLAS";
    return;
  }
  if (auto best = core_of_level(cpu_level()))
    state.cpu_best = best;
  auto set = environment(core_variable);
  auto record = environment(record_variable);
  if (!record.empty() && record_field(record, "to") == set) {
    state.how = "corrected from " + record_field(record, "from");
    state.check_error = std::strtod(record_field(record, "error").c_str(), nullptr);
    state.check_passed = state.check_error <= error_bound;
  } else if (!set.empty() && strcasecmp(set.c_str(), state.core.c_str()) != 0) {
    // OpenBLAS ignores a name it does not know (or kernels the CPU lacks) and detects the core itself.
    state.how = "detected by OpenBLAS; " + std::string(core_variable) + "=" + set +
                " was not taken: no core of that name, or one this CPU cannot run";
  } else if (!set.empty()) {
    state.how = "set by " + std::string(core_variable);
  } else {
    state.how = "detected by OpenBLAS";
  }
}

}  // namespace

std::string best_blas_core_for_cpu() {
  auto best = core_of_level(cpu_level());
  return best ? best : "";
}

void fit_blas_core(int argc, char** argv) {
  (void)argc;
  if (!environment(probe_variable).empty()) {
    // The child started by probe_core: check the kernels it was loaded with and report.
    std::printf("core=%s;error=%.3e\n", loaded_core().c_str(), check_products());
    std::fflush(stdout);
    std::_Exit(0);
  }
  describe_loaded();
  if (state.core.empty())
    return;
  bool corrected = state.how.rfind("corrected", 0) == 0;
  if (!corrected) {
    state.check_error = check_products();
    state.check_passed = state.check_error <= error_bound;
  }
  auto policy = environment(policy_variable);
  if (policy.empty())
    policy = "auto";
  if (policy != "auto" && policy != "fit" && policy != "keep") {
    state.warning = std::string(policy_variable) + "=" + policy + " is not a policy: use auto, fit or keep (kept the " +
                    state.core + " kernels)";
    return;
  }
  int loaded = core_level(state.core), best = cpu_level();
  bool below = loaded > 0 && loaded < best;
  bool user_set = state.how.rfind("set by", 0) == 0;
  bool may_change = !corrected && environment(record_variable).empty() && policy != "keep" &&
                    !(user_set && policy == "auto");
  if (may_change && (below || !state.check_passed)) {
    // Candidates from the CPU's level down: above the loaded core, or any other
    // when the loaded one computes wrong.
    std::string tried;
    for (int level = best; level >= 2; --level) {
      if (level == loaded || (state.check_passed && level < loaded))
        continue;
      std::string candidate = core_of_level(level);
      auto [error, why] = probe_core(candidate, argv);
      if (error <= error_bound) {
        auto record = "from=" + state.core + ";to=" + candidate + ";error=" + format_error(error);
        setenv(core_variable, candidate.c_str(), 1);
        setenv(record_variable, record.c_str(), 1);
        execv("/proc/self/exe", argv);
        tried += candidate + ": could not execute the program again (" + std::strerror(errno) + "); ";
        unsetenv(record_variable);
        break;
      }
      tried += candidate + ": " + (why.empty() ? "products wrong, error " + format_error(error) : why) + "; ";
    }
    state.warning = "OpenBLAS runs the " + state.core + " kernels and no better core passed the check (" + tried +
                    "kept " + state.core + ")";
    return;
  }
  if (!state.check_passed)
    state.warning = "OpenBLAS's " + state.core + " kernels computed a known product wrong (error " +
                    format_error(state.check_error) + "): results cannot be trusted; set " + core_variable +
                    " to an older core, e.g. Haswell";
  else if (below && user_set)
    state.warning = std::string(core_variable) + "=" + environment(core_variable) +
                    " (set in the environment) runs kernels below this CPU's " + state.cpu_best + ": unset it, or set " +
                    policy_variable + "=fit to let areal choose";
  else if (below)
    state.warning = "OpenBLAS runs the " + state.core + " kernels, below this CPU's " + state.cpu_best + " (" +
                    policy_variable + "=" + policy + ")";
}

const blas_core_state& blas_core() {
  describe_loaded();
  return state;
}

std::string describe_blas_core() {
  auto& s = blas_core();
  if (s.core.empty())
    return "no OpenBLAS";
  std::string text = "core " + s.core + " (" + s.how;
  if (!s.cpu_best.empty() && core_level(s.core) < core_level(s.cpu_best))
    text += "; this CPU supports " + s.cpu_best;
  if (s.check_error >= 0)
    text += std::string(s.check_passed ? "; products checked" : "; products WRONG") + ", error " +
            format_error(s.check_error);
  return text + ")";
}

}  // namespace areal
