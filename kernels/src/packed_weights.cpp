#include "packed_weights.hpp"

#include "areal/kernels/fused_layers.hpp"
#include "cpu_packed_gemm.hpp"
#include "cpu_train_kernels.hpp"

#include <stdexcept>

namespace areal::kernels {

namespace {

const float* norm_weight(const at::Tensor& norm, int64_t k) {
  if (!norm.defined())
    return nullptr;
  if (norm.dim() != 1 || norm.size(0) != k || norm.scalar_type() != at::kFloat || !norm.is_contiguous())
    throw std::invalid_argument("packed weight: the folded norm weight must be float32 [k], contiguous");
  return norm.data_ptr<float>();
}

}  // namespace

packed_matrix::packed_matrix(const at::Tensor& w, const at::Tensor& input_norm) : n(w.size(0)), k(w.size(1)) {
  auto src = w.contiguous();
  data = at::empty({cpu::packed_size(n, k)}, w.options());
  cpu::pack_weight(src.data_ptr<float>(), n, k, data.data_ptr<float>(), norm_weight(input_norm, k));
}

packed_matrix packed_matrix::swiglu_of(const at::Tensor& gate_up, const at::Tensor& input_norm) {
  if (gate_up.size(0) % 2 != 0)
    throw std::invalid_argument("packed SwiGLU weight: gate_up needs an even number of rows (gate, then up)");
  packed_matrix out;
  out.n = gate_up.size(0) / 2;
  out.k = gate_up.size(1);
  out.swiglu = true;
  auto src = gate_up.contiguous();
  out.data = at::empty({cpu::packed_swiglu_size(out.n, out.k)}, gate_up.options());
  cpu::pack_swiglu(src.data_ptr<float>(), out.n, out.k, out.data.data_ptr<float>(), norm_weight(input_norm, out.k));
  return out;
}

namespace {

cpu::packed_product_args args_for(const packed_matrix& w, const at::Tensor& x, at::Tensor& y) {
  if (x.dim() != 2 || x.size(1) != w.k || x.stride(1) != 1 || y.size(0) != x.size(0) || y.size(1) != w.n ||
      !y.is_contiguous())
    throw std::invalid_argument("packed product: shapes do not match the packed weight");
  cpu::packed_product_args a;
  a.x = x.data_ptr<float>();
  a.x_stride = x.stride(0);
  a.m = x.size(0);
  a.packed = w.data.data_ptr<float>();
  a.n = w.n;
  a.k = w.k;
  a.y = y.data_ptr<float>();
  a.y_stride = w.n;
  a.swiglu = w.swiglu;
  return a;
}

}  // namespace

at::Tensor packed_matrix::product(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& row_scale) const {
  auto y = at::empty({x.size(0), n}, x.options());
  auto a = args_for(*this, x, y);
  if (swiglu && bias.defined())
    throw std::invalid_argument("packed product: a SwiGLU packing takes no bias");
  auto b = bias.defined() ? bias.contiguous() : bias;
  a.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  if (row_scale.defined()) {
    if (row_scale.numel() != x.size(0) || row_scale.scalar_type() != at::kFloat || !row_scale.is_contiguous())
      throw std::invalid_argument("packed product: row_scale must be float32 [m], contiguous");
    a.row_scale = row_scale.data_ptr<float>();
  }
  cpu::packed_product(a);
  return y;
}

void packed_matrix::add_product(at::Tensor& y, const at::Tensor& x) const {
  if (swiglu)
    throw std::invalid_argument("packed product: a SwiGLU packing does not accumulate");
  auto a = args_for(*this, x, y);
  a.accumulate = true;
  cpu::packed_product(a);
}

at::Tensor inverse_rms(const at::Tensor& x, double eps) {
  if (x.dim() != 2 || x.scalar_type() != at::kFloat || !x.device().is_cpu() || x.stride(1) != 1)
    throw std::invalid_argument("inverse_rms: x must be float32 [m, k] on the CPU with unit column stride");
  auto out = at::empty({x.size(0)}, x.options());
  cpu::inverse_rms(x.data_ptr<float>(), x.stride(0), x.size(0), x.size(1), static_cast<float>(eps),
                   out.data_ptr<float>());
  return out;
}

bool packed_weights::applies(const at::Tensor& x, int64_t rows) {
  return fused::applies(x) && rows > 0;
}

}  // namespace areal::kernels
