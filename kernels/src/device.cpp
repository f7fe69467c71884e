#include "areal/kernels/device.hpp"
#include "cuda_decode.hpp"

#include "areal/kernels/model_config.hpp"

#include <torch/cuda.h>

namespace areal::kernels {

at::TensorOptions tensor_options(const std::string& device, const std::string& dtype) {
  at::ScalarType type;
  if (dtype == "float32")
    type = at::kFloat;
  else if (dtype == "bfloat16")
    type = at::kBFloat16;
  else if (dtype == "float16")
    type = at::kHalf;
  else
    throw format_error("model dtype \"" + dtype + "\" is not supported; use float32, bfloat16 or float16");
  if (device == "cpu")
    return at::TensorOptions().dtype(type).device(at::kCPU);
  if (device.rfind("cuda", 0) == 0) {
    if (!cuda_available())
      throw format_error(
          "device \"" + device +
          "\" asked for (model.device, or a node's devices), but this LibTorch build has no CUDA (or no GPU is "
          "visible); use \"cpu\"");
    int index = 0;
    if (device.size() > 5 && device[4] == ':')
      index = std::stoi(device.substr(5));
    else if (device != "cuda")
      throw format_error("device \"" + device + "\": write cuda or cuda:N");
    auto count = static_cast<int>(torch::cuda::device_count());
    if (index >= count)
      throw format_error("device \"" + device + "\": this machine shows " + std::to_string(count) +
                         " GPU(s), cuda:0 to cuda:" + std::to_string(count - 1) +
                         " (CUDA_VISIBLE_DEVICES renumbers them); name one of those");
    return at::TensorOptions().dtype(type).device(at::Device(at::kCUDA, static_cast<at::DeviceIndex>(index)));
  }
  throw format_error("device \"" + device + "\" is not supported; use cpu or cuda[:N]");
}

bool cuda_available() {
  return torch::cuda::is_available();
}

int gpu_count() {
  return cuda_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

void synchronize(const at::Device& device) {
  if (device.is_cuda())
    torch::cuda::synchronize(device.index());
}

bool cuda_kernels_built() {
  return cuda_decode::available();
}

void set_cuda_kernels(bool on) {
  cuda_decode::set_enabled(on);
}

}  // namespace areal::kernels
