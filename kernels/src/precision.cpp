// The compute precision scope (see precision.hpp).
#include "areal/kernels/precision.hpp"

#include "torch_compat.hpp"

#include <stdexcept>

namespace areal::kernels {

at::ScalarType parse_compute_dtype(const std::string& name) {
  if (name == "float32")
    return at::kFloat;
  if (name == "bfloat16")
    return at::kBFloat16;
  throw std::invalid_argument("compute dtype \"" + name + "\": use float32 or bfloat16");
}

namespace {

constexpr at::DeviceType scoped_devices[2] = {at::kCPU, at::kCUDA};

}  // namespace

compute_precision::compute_precision(at::ScalarType compute) {
  if (compute == at::kFloat)
    return;
  if (compute != at::kBFloat16)
    throw std::invalid_argument("compute precision: only float32 and bfloat16 are supported");
  active_ = true;
  for (int i = 0; i < 2; ++i) {
    auto was = compat::autocast_of(scoped_devices[i]);
    was_enabled_[i] = was.enabled;
    was_dtype_[i] = was.dtype;
    compat::set_autocast(scoped_devices[i], {true, compute});
  }
  at::autocast::increment_nesting();
}

compute_precision::~compute_precision() {
  if (!active_)
    return;
  // Leaving the outermost scope drops the cached casts: the parameters change
  // at the next optimizer step, and a stale bfloat16 copy must not be reused.
  if (at::autocast::decrement_nesting() == 0)
    at::autocast::clear_cache();
  for (int i = 0; i < 2; ++i)
    compat::set_autocast(scoped_devices[i], {was_enabled_[i], was_dtype_[i]});
}

}  // namespace areal::kernels
