// The compute precision of a scope: float32, or bfloat16 matrix products with
// float32 parameters, optimizer state, residual stream, norms and softmax
// (LibTorch's autocast, on the CPU and on CUDA devices alike). Autocast is per
// thread, so every thread that runs a forward or backward pass opens its own scope.
#pragma once

#include <string>

#include <ATen/ATen.h>

namespace areal::kernels {

/// "float32" or "bfloat16"; anything else throws std::invalid_argument naming the choices.
at::ScalarType parse_compute_dtype(const std::string& name);

class compute_precision {
 public:
  /// kFloat: nothing changes. kBFloat16: autocast to bfloat16 (CPU and CUDA) until the scope ends.
  explicit compute_precision(at::ScalarType compute);
  ~compute_precision();
  compute_precision(const compute_precision&) = delete;
  compute_precision& operator=(const compute_precision&) = delete;

 private:
  bool active_ = false;
  // What the scope replaced, restored when it ends: CPU's, then CUDA's.
  bool was_enabled_[2] = {false, false};
  at::ScalarType was_dtype_[2] = {at::kBFloat16, at::kBFloat16};
};

}  // namespace areal::kernels
