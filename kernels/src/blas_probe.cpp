#include "areal/kernels/blas_probe.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include "areal/runtime/blas_core.hpp"
#include "packed_weights.hpp"

namespace areal::kernels {

namespace {

// The BLAS in use is whichever shared object the dynamic linker mapped for it;
// Debian's alternatives decide between the reference BLAS and OpenBLAS.
std::string mapped_blas_library() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::string found;
  while (std::getline(maps, line)) {
    auto slash = line.rfind('/');
    if (slash == std::string::npos)
      continue;
    auto file = line.substr(slash + 1);
    auto is_blas = file.find("openblas") != std::string::npos || file.find("libblas") != std::string::npos ||
                   file.find("mkl") != std::string::npos || file.find("blis") != std::string::npos;
    if (is_blas && file.find("lapack") == std::string::npos) {
      // Prefer the real implementation over the libblas.so.3 alternative link name.
      auto path = line.substr(line.find('/'));
      if (found.empty() || file.find("openblas") != std::string::npos)
        found = path;
    }
  }
  return found;
}

}  // namespace

blas_facts probe_blas() {
  auto a = at::ones({64, 64});
  auto c = at::mm(a, a);
  (void)c;
  blas_facts f;
  f.library = mapped_blas_library();
  if (f.library.empty())
    f.library = "(none mapped: LibTorch uses its own kernels)";
  f.reference_blas = f.library.find("openblas") == std::string::npos && f.library.find("mkl") == std::string::npos &&
                     f.library.find("blis") == std::string::npos && f.library.find("blas") != std::string::npos;
  f.intra_op_threads = at::get_num_threads();
  f.torch_version = TORCH_VERSION;
  return f;
}

double measure_gemm_gflops(int64_t m, int64_t k, int64_t n, int repeats) {
  auto a = at::randn({m, k});
  auto b = at::randn({k, n});
  auto c = at::mm(a, b);  // warm-up
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) / best / 1e9;
}

double measure_packed_gemm_gflops(int64_t m, int64_t k, int64_t n, int repeats) {
  auto x = at::randn({m, k});
  auto w = packed_matrix(at::randn({n, k}));
  auto y = w.product(x);  // warm-up
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    w.add_product(y, x);
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) / best / 1e9;
}

double measure_gemm_gflops(int n, int repeats) {
  return measure_gemm_gflops(n, n, n, repeats);
}

std::string describe(const blas_facts& f) {
  std::string kind = f.reference_blas ? "REFERENCE BLAS (slow: install libopenblas0-openmp)"
                     : f.library.find("openblas") != std::string::npos ? "OpenBLAS"
                                                                       : "other";
  if (kind == "OpenBLAS")
    kind += ", " + describe_blas_core();
  return "BLAS " + f.library + " (" + kind + "), " + std::to_string(f.intra_op_threads) + " intra-op thread" +
         (f.intra_op_threads == 1 ? "" : "s") + ", LibTorch " + f.torch_version;
}

}  // namespace areal::kernels
