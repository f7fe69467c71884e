// Where the LibTorch versions this project builds against differ (Debian 12's
// 1.13 and the 2.x of a PyTorch installation, CUDA builds included): each
// difference is settled here once, so that no other file tests a version.
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <stdexcept>

#define AREAL_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace areal::kernels::compat {

/// The autocast switch and type of one device type (kCPU or kCUDA), per thread.
struct autocast_setting {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;
};

inline autocast_setting autocast_of(at::DeviceType device) {
#if AREAL_TORCH_AT_LEAST(2, 4)
  return {at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)};
#else
  if (device == at::kCUDA)
    return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
  return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
#endif
}

inline void set_autocast(at::DeviceType device, autocast_setting s) {
#if AREAL_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, s.enabled);
  at::autocast::set_autocast_dtype(device, s.dtype);
#else
  if (device == at::kCUDA) {
    at::autocast::set_enabled(s.enabled);
    at::autocast::set_autocast_gpu_dtype(s.dtype);
  } else {
    at::autocast::set_cpu_enabled(s.enabled);
    at::autocast::set_autocast_cpu_dtype(s.dtype);
  }
#endif
}

/// Whether ATen has scaled_dot_product_attention with an explicit scale (2.1 on;
/// AREAL_SDPA: CMake compiled a probe of the call below): its fused kernels
/// (flash, memory-efficient) on a GPU, a math path elsewhere.
#ifndef AREAL_SDPA
#define AREAL_SDPA 0
#endif
constexpr bool has_sdpa = AREAL_SDPA;

/// softmax(q k^T * scale + bias) v over the last two dimensions, in ATen's kernel
/// where has_sdpa (else never called). q [n, h, L, d], k and v [n, h, S, d], bias
/// [n or 1, 1, L, S], all of one dtype.
inline at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                       double scale) {
#if AREAL_SDPA
  return at::scaled_dot_product_attention(q, k, v, bias, 0.0, false, scale);
#else
  (void)q, (void)k, (void)v, (void)bias, (void)scale;
  throw std::logic_error("scaled_dot_product_attention needs LibTorch 2.1 or newer");
#endif
}

}  // namespace areal::kernels::compat

#if AREAL_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>

namespace areal::kernels::compat {

/// Starts a capture into `graph`; from 2.1 on confined to the capturing thread, so
/// that another thread's CUDA calls (another engine, a trainer) do not break it.
inline void capture_begin(at::cuda::CUDAGraph& graph, decltype(at::cuda::graph_pool_handle()) pool) {
#if AREAL_TORCH_AT_LEAST(2, 1)
  graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
#else
  graph.capture_begin(pool);
#endif
}

}  // namespace areal::kernels::compat
#endif
