// The test programs' main: OpenBLAS's kernels fitted to the CPU first (the
// program may be executed again with them), then doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "areal/runtime/blas_core.hpp"

int main(int argc, char** argv) {
  areal::fit_blas_core(argc, argv);
  return doctest::Context(argc, argv).run();
}
