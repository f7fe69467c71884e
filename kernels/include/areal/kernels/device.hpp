// Device and dtype from configuration: cpu/float32 by default; cuda and
// bfloat16 where LibTorch was built with CUDA. The CPU build never needs CUDA.
#pragma once

#include <string>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

namespace areal::kernels {

/// Options for model tensors. `device`: "cpu", "cuda" or "cuda:N"; `dtype`:
/// "float32", "bfloat16" or "float16". Throws format_error saying what is
/// unavailable and what to use instead.
at::TensorOptions tensor_options(const std::string& device, const std::string& dtype);

/// Makes a GPU the calling thread's current device while it lives, as a thread
/// computing on it needs (kernels launch on the current device); on the CPU,
/// nothing.
class device_scope {
 public:
  explicit device_scope(const at::Device& device)
      : guard_(device.is_cpu() ? c10::optional<at::Device>{} : c10::optional<at::Device>{device}) {}

 private:
  c10::OptionalDeviceGuard guard_;
};

/// Whether this LibTorch was built with CUDA and sees at least one GPU.
bool cuda_available();
/// The GPUs this process sees (0 without CUDA).
int gpu_count();

/// Waits until the device has finished the work queued on it (a timing needs
/// it: GPU kernels run asynchronously); nothing to wait for on the CPU.
void synchronize(const at::Device& device);

/// Whether this build has the decode step's fused CUDA kernels (a LibTorch with CUDA).
bool cuda_kernels_built();
/// Switches them for the process (on by default): off, a GPU decode step runs op by op.
void set_cuda_kernels(bool on);

}  // namespace areal::kernels
