#include "packed_weights.hpp"

#include "areal/kernels/fused_layers.hpp"
#include "cpu_packed_gemm.hpp"

#include <stdexcept>

namespace areal::kernels {

packed_matrix::packed_matrix(const at::Tensor& w) : n(w.size(0)), k(w.size(1)) {
  auto src = w.contiguous();
  data = at::empty({cpu::packed_size(n, k)}, w.options());
  cpu::pack_weight(src.data_ptr<float>(), n, k, data.data_ptr<float>());
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
  return a;
}

}  // namespace

at::Tensor packed_matrix::product(const at::Tensor& x, const at::Tensor& bias) const {
  auto y = at::empty({x.size(0), n}, x.options());
  auto a = args_for(*this, x, y);
  auto b = bias.defined() ? bias.contiguous() : bias;
  a.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  cpu::packed_product(a);
  return y;
}

void packed_matrix::add_product(at::Tensor& y, const at::Tensor& x) const {
  auto a = args_for(*this, x, y);
  a.accumulate = true;
  cpu::packed_product(a);
}

bool packed_weights::applies(const at::Tensor& x, int64_t rows) {
  return fused::applies(x) && rows > 0 && rows <= max_rows;
}

}  // namespace areal::kernels
