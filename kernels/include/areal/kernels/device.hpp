// Device and dtype from configuration: cpu/float32 by default; cuda and
// bfloat16 where LibTorch was built with CUDA. The CPU build never needs CUDA.
#pragma once

#include <string>

#include <ATen/ATen.h>

namespace areal::kernels {

/// Options for model tensors. `device`: "cpu", "cuda" or "cuda:N"; `dtype`:
/// "float32", "bfloat16" or "float16". Throws format_error saying what is
/// unavailable and what to use instead.
at::TensorOptions tensor_options(const std::string& device, const std::string& dtype);

}  // namespace areal::kernels
