// Facts about the numerical backend that every benchmark prints and every
// efficiency figure is divided by: which BLAS library LibTorch really calls,
// how many intra-op threads it uses, and the matrix-product rate it reaches.
// Kept free of LibTorch headers so that callers compile fast.
#pragma once

#include <cstdint>
#include <string>

namespace areal::kernels {

struct blas_facts {
  std::string library;   // file of the BLAS mapped into this process, e.g. libopenblasp-r0.3.21.so
  bool reference_blas;   // true when the slow reference BLAS is live (libopenblas0 missing)
  int intra_op_threads;  // at::get_num_threads()
  std::string torch_version;
};

/// Runs one small product (so that lazily loaded BLAS is mapped) and reports.
blas_facts probe_blas();

/// Rate of an n x n x n fp32 matrix product, in GFLOP/s (best of `repeats`
/// after one warm-up), with the current intra-op threads.
double measure_gemm_gflops(int n = 512, int repeats = 5);
/// The same for an [m x k] by [k x n] product.
double measure_gemm_gflops(int64_t m, int64_t k, int64_t n, int repeats);

/// The rate of the decode step's own product over a packed weight
/// (cpu_packed_gemm.hpp) for x [m x k] by w^T [k x n], measured the same way:
/// the other GEMM the CPU runs at these sizes, so a ceiling takes the faster.
double measure_packed_gemm_gflops(int64_t m, int64_t k, int64_t n, int repeats);

/// "BLAS libopenblas... (OpenBLAS), 1 intra-op thread, LibTorch 1.13.1".
std::string describe(const blas_facts& facts);

}  // namespace areal::kernels
