// GCC vector-extension types for the hand-written CPU loops that block by
// vector width (cpu_attention.cpp, cpu_train_attention.cpp), and their loads
// and stores. Used inside the always-inline bodies of cpu_isa.hpp's
// per-instruction-set copies, so each copy lowers them for its own set.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu_isa.hpp"

// Vector-extension types passed between always-inline helpers: GCC notes the
// ABI of such arguments would differ between instruction sets, which does not
// matter for functions that are always inlined into one of them.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace areal::kernels::cpu {

using f32x16 = float __attribute__((vector_size(64)));
using i32x16 = int32_t __attribute__((vector_size(64)));
using f32x8 = float __attribute__((vector_size(32)));
using i32x8 = int32_t __attribute__((vector_size(32)));

template <typename V>
constexpr int width = sizeof(V) / sizeof(float);

template <typename V>
AREAL_INLINE V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V>
AREAL_INLINE void store(float* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

}  // namespace areal::kernels::cpu
