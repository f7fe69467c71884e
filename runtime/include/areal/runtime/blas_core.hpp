// Which kernels OpenBLAS runs in this process, and making them fit the CPU.
//
// Debian 12's OpenBLAS 0.3.21 does not know every current CPU: on a Sapphire
// Rapids Xeon it reports the generic core "Prescott" and runs SSE kernels,
// 2-7x slower (see ARCHITECTURE.md, section 8). It reads OPENBLAS_CORETYPE only
// when it is loaded, before main(), so the fix is to execute the program once
// more with the variable set. fit_blas_core() does that, after a child process
// has checked the candidate's products against a reference; it also checks the
// products of the kernels it keeps.
//
// AREAL_BLAS_CORE selects the policy:
//   auto (default)  correct a core below the CPU's level unless OPENBLAS_CORETYPE was set;
//   fit             correct it even when OPENBLAS_CORETYPE names it;
//   keep            never re-execute (the check still runs and warns).
// Free of LibTorch: the products are OpenBLAS's own sgemm_/sgemv_, found with dlsym.
#pragma once

#include <string>

namespace areal {

struct blas_core_state {
  std::string core;          // kernels OpenBLAS runs, e.g. "SkylakeX"; empty: no OpenBLAS in this process
  std::string cpu_best;      // the best core this CPU supports, e.g. "SkylakeX"; empty: none known
  std::string how;           // "detected by OpenBLAS", "set by OPENBLAS_CORETYPE", "corrected from Prescott"
  double check_error = -1;   // largest scaled error of the known products; < 0: not checked
  bool check_passed = false;
  std::string warning;       // non-empty: what is wrong and what to do
};

/// Call first in main(), before anything else runs: it may execute the program
/// again (same arguments) with OPENBLAS_CORETYPE set, or, in the child that
/// checks a candidate core, exit. Afterwards blas_core() says what was chosen.
void fit_blas_core(int argc, char** argv);

/// What fit_blas_core() found (also valid when it was not called: then it
/// describes the loaded core without a check).
const blas_core_state& blas_core();

/// "core SkylakeX (corrected from Prescott; products checked, error 4e-08)", or
/// "no OpenBLAS" — for start-up lines and every benchmark's machine facts.
std::string describe_blas_core();

/// The core OpenBLAS would be corrected to on this CPU ("SkylakeX", "Haswell",
/// "Sandybridge"), or empty when the CPU supports none of them.
std::string best_blas_core_for_cpu();

}  // namespace areal
