// The compute precision scope (see precision.hpp).
#include "areal/kernels/precision.hpp"

#include <ATen/autocast_mode.h>

#include <stdexcept>

namespace areal::kernels {

at::ScalarType parse_compute_dtype(const std::string& name) {
  if (name == "float32")
    return at::kFloat;
  if (name == "bfloat16")
    return at::kBFloat16;
  throw std::invalid_argument("compute dtype \"" + name + "\": use float32 or bfloat16");
}

compute_precision::compute_precision(at::ScalarType compute) {
  if (compute == at::kFloat)
    return;
  if (compute != at::kBFloat16)
    throw std::invalid_argument("compute precision: only float32 and bfloat16 run on the CPU");
  active_ = true;
  was_enabled_ = at::autocast::is_cpu_enabled();
  was_dtype_ = at::autocast::get_autocast_cpu_dtype();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(compute);
  at::autocast::increment_nesting();
}

compute_precision::~compute_precision() {
  if (!active_)
    return;
  // Leaving the outermost scope drops the cached casts: the parameters change
  // at the next optimizer step, and a stale bfloat16 copy must not be reused.
  if (at::autocast::decrement_nesting() == 0)
    at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(was_enabled_);
  at::autocast::set_autocast_cpu_dtype(was_dtype_);
}

}  // namespace areal::kernels
