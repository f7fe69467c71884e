// What the hand-written CPU loops share (cpu_kernels.cpp, cpu_train_kernels.cpp):
// the instruction-set attributes their copies are compiled for, the CPU's set
// found once at load time, and a branch-free exp that vectorizes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace areal::kernels::cpu {

// The loop bodies are always-inline functions without a target, instantiated
// in one function per instruction set: the compiler vectorizes each copy for
// its set, and the caller chooses the copy by cpu_isa, what this CPU supports.
#define AREAL_INLINE inline __attribute__((always_inline))
#define AREAL_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#define AREAL_AVX2 __attribute__((target("avx2,fma")))

enum class isa { baseline, avx2, avx512 };

inline isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq"))
    return isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return isa::avx2;
  return isa::baseline;
}

// Not const: a test runs the copies for lower sets too (never set it above detect_isa()).
inline isa cpu_isa = detect_isa();

// Every set this CPU runs, lowest first: the copies a test can run here.
inline std::vector<isa> runnable_isas() {
  auto detected = detect_isa();
  std::vector<isa> sets = {isa::baseline};
  if (detected != isa::baseline)
    sets.push_back(isa::avx2);
  if (detected == isa::avx512)
    sets.push_back(isa::avx512);
  return sets;
}

// exp(x) for x <= 0 (x is clamped to [-87, 88]; up to 88 it holds too): e^x = 2^k * e^r with
// k = round(x / ln 2), |r| <= ln(2) / 2, e^r by its Taylor polynomial of
// degree 7; relative error below 1e-7 over [-87, 0]. Branch-free, so that
// loops over it vectorize (libm's expf does not, without -ffast-math; and
// these do only with -fno-trapping-math, see kernels/CMakeLists.txt).
AREAL_INLINE float exp_nonpositive(float x) {
  // Not std::max/min: their reference to a constant keeps GCC from vectorizing the loop.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // round-half-up of x / ln 2 through truncation of a positive number
  float k = static_cast<float>(static_cast<int32_t>(x * 1.44269504088896341f + 128.5f) - 128);
  float r = x - k * 0.693359375f + k * 2.12194440e-4f;  // ln 2 in two parts: exact product with k
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float two_k;
  std::memcpy(&two_k, &bits, sizeof two_k);
  return p * two_k;
}

// sigmoid(g) = 1 / (1 + e^-g); exp_nonpositive clamps its argument to
// [-87, 88], so this holds for every g (and has no branch: it vectorizes).
AREAL_INLINE float sigmoid(float g) {
  return 1.0f / (1.0f + exp_nonpositive(-g));
}

// Denormal floats flushed to zero (results) and read as zero (operands) on
// this thread while it lives; the previous mode is restored after. Each task
// of a hand-written loop runs under one: an operand or result below
// FLT_MIN costs a microcode assist of about a hundred cycles on x86, and GCC
// if-converts the loops by computing every branch in every lane. SwiGLU's
// branch for an argument below exp's clamp multiplied by the folded constant
// 1 / (1 + e^88), itself a denormal, on every element: 7x slower (measured).
// Values that small do not matter to a model.
class denormals_flushed {
 public:
#if defined(__x86_64__) || defined(__i386__)
  // 0x8040: flush to zero (FTZ) | denormals are zero (DAZ)
  denormals_flushed() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~denormals_flushed() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
  denormals_flushed(const denormals_flushed&) = delete;
  denormals_flushed& operator=(const denormals_flushed&) = delete;
};

}  // namespace areal::kernels::cpu
