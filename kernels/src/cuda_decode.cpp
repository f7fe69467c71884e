#include "cuda_decode.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

#include <ATen/core/grad_mode.h>

#if AREAL_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/decode_kernels.cuh"
#endif

namespace areal::kernels::cuda_decode {

namespace {
std::atomic<bool> enabled_flag{true};
}  // namespace

void set_enabled(bool on) {
  enabled_flag = on;
}

bool enabled() {
  return enabled_flag.load(std::memory_order_relaxed);
}

#if AREAL_CUDA_KERNELS

namespace {

cuda_launch::element element_of(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? cuda_launch::element::bf16 : cuda_launch::element::f32;
}

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check_launch(const char* kernel) {
  std::string error = cuda_launch::last_error();
  if (!error.empty())
    throw std::runtime_error(std::string("CUDA kernel ") + kernel + " failed: " + error);
}

void require(bool ok, const char* what) {
  if (!ok)
    throw std::invalid_argument(std::string("cuda_decode: ") + what);
}

}  // namespace

bool available() {
  return true;
}

bool applies(const at::Tensor& x, const at::Tensor& cache_keys, int64_t head_dim) {
  auto type = x.scalar_type();
  return enabled() && x.is_cuda() && (type == at::kFloat || type == at::kBFloat16) &&
         cache_keys.scalar_type() == type && cache_keys.device() == x.device() && head_dim % 2 == 0 &&
         head_dim <= 128 && !at::GradMode::is_enabled();
}

at::Tensor add_rms_norm(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  require(x.is_contiguous() && x.dim() == 2, "add_rms_norm needs a contiguous [rows, width] x");
  auto d = delta.defined() ? delta.contiguous() : delta;
  auto w = weight.contiguous();
  require(!d.defined() || (d.sizes() == x.sizes() && d.scalar_type() == x.scalar_type()), "delta unlike x");
  require(w.numel() == x.size(1) && w.scalar_type() == x.scalar_type(), "weight unlike x's rows");
  auto out = at::empty_like(x);
  c10::cuda::CUDAGuard on_device(x.device());  // a kernel launches on the current device
  cuda_launch::add_rms_norm(element_of(x), x.data_ptr(), d.defined() ? d.data_ptr() : nullptr, w.data_ptr(),
                            out.data_ptr(), x.size(0), x.size(1), static_cast<float>(eps), stream_of(x));
  check_launch("add_rms_norm");
  return out;
}

at::Tensor rotary_to_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& cache_rows, at::Tensor& cache_keys, at::Tensor& cache_values,
                           int64_t q_width, int64_t kv_width, int64_t head_dim) {
  auto tokens = qkv.size(0);
  auto source = qkv.contiguous();
  auto c = cos.contiguous(), s = sin.contiguous();
  auto rows = cache_rows.contiguous();
  require(source.size(1) == q_width + 2 * kv_width, "qkv's width is not q + 2 kv");
  require(c.numel() == tokens * head_dim && s.numel() == tokens * head_dim, "cos and sin are not [tokens, head_dim]");
  require(c.scalar_type() == qkv.scalar_type() && s.scalar_type() == qkv.scalar_type(), "angles unlike qkv");
  require(rows.scalar_type() == at::kLong && rows.numel() == tokens * (kv_width / head_dim), "cache rows");
  require(cache_keys.is_contiguous() && cache_values.is_contiguous() && cache_keys.scalar_type() == qkv.scalar_type() &&
              cache_values.scalar_type() == qkv.scalar_type(),
          "caches must be contiguous and of qkv's type");
  auto q = at::empty({tokens, q_width}, qkv.options());
  c10::cuda::CUDAGuard on_device(qkv.device());
  cuda_launch::rotary_to_cache(element_of(qkv), source.data_ptr(), c.data_ptr(), s.data_ptr(), rows.data_ptr<int64_t>(),
                               q.data_ptr(), cache_keys.data_ptr(), cache_values.data_ptr(), tokens, q_width, kv_width,
                               head_dim, stream_of(qkv));
  check_launch("rotary_to_cache");
  return q;
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& cache_keys, const at::Tensor& cache_values,
                            const at::Tensor& positions, int64_t heads, double scale) {
  require(cache_keys.dim() == 4 && cache_keys.is_contiguous() && cache_values.is_contiguous(),
          "caches must be contiguous [slots, kv_heads, max_len, head_dim]");
  auto kv_heads = cache_keys.size(1), max_len = cache_keys.size(2), head_dim = cache_keys.size(3);
  auto batch = q.size(0);
  auto query = q.contiguous();
  auto pos = positions.contiguous();
  require(query.size(1) == heads * head_dim && heads % kv_heads == 0 && head_dim <= 128, "q unlike the cache");
  require(batch <= cache_keys.size(0) && pos.scalar_type() == at::kLong && pos.numel() == batch, "positions");
  auto out = at::empty_like(query);
  c10::cuda::CUDAGuard on_device(query.device());
  cuda_launch::decode_attention(element_of(query), query.data_ptr(), cache_keys.data_ptr(), cache_values.data_ptr(),
                                pos.data_ptr<int64_t>(), out.data_ptr(), batch, heads, kv_heads, max_len, head_dim,
                                static_cast<float>(scale), stream_of(query));
  check_launch("decode_attention");
  return out;
}

at::Tensor swiglu(const at::Tensor& gate_up) {
  auto source = gate_up.contiguous();
  auto tokens = source.size(0), inter = source.size(1) / 2;
  auto out = at::empty({tokens, inter}, source.options());
  c10::cuda::CUDAGuard on_device(source.device());
  cuda_launch::swiglu(element_of(source), source.data_ptr(), out.data_ptr(), tokens, inter, stream_of(source));
  check_launch("swiglu");
  return out;
}

bool sampler_applies(const at::Tensor& logits) {
  auto type = logits.scalar_type();
  return enabled() && logits.is_cuda() && logits.dim() == 2 && (type == at::kFloat || type == at::kBFloat16);
}

at::Tensor sample_plain(const at::Tensor& logits, const at::Tensor& params, int64_t inv_temperature_column,
                        int64_t greedy_column, int64_t uniform_column) {
  auto source = logits.contiguous();
  auto p = params.contiguous();
  auto rows = source.size(0), vocab = source.size(1);
  require(p.scalar_type() == at::kDouble && p.dim() == 2 && p.size(0) == rows && p.device() == source.device(),
          "sample_plain needs float64 params [rows, columns] on the logits' device");
  for (auto c : {inv_temperature_column, greedy_column, uniform_column})
    require(c >= 0 && c < p.size(1), "sample_plain: a parameter column past the params' width");
  auto out = at::empty({rows, 3}, p.options());
  if (rows == 0)
    return out;
  c10::cuda::CUDAGuard on_device(source.device());
  cuda_launch::sample_plain(element_of(source), source.data_ptr(), p.data_ptr<double>(), p.size(1),
                            inv_temperature_column, greedy_column, uniform_column, out.data_ptr<double>(), rows, vocab,
                            stream_of(source));
  check_launch("sample_plain");
  return out;
}

#else

namespace {
[[noreturn]] void absent() {
  throw std::logic_error("cuda_decode: this build has no CUDA kernels (LibTorch without CUDA)");
}
}  // namespace

bool available() {
  return false;
}
bool applies(const at::Tensor&, const at::Tensor&, int64_t) {
  return false;
}
at::Tensor add_rms_norm(at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
  absent();
}
at::Tensor rotary_to_cache(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                           at::Tensor&, int64_t, int64_t, int64_t) {
  absent();
}
at::Tensor decode_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                            double) {
  absent();
}
at::Tensor swiglu(const at::Tensor&) {
  absent();
}
bool sampler_applies(const at::Tensor&) {
  return false;
}
at::Tensor sample_plain(const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t) {
  absent();
}

#endif

}  // namespace areal::kernels::cuda_decode
