#include "areal/kernels/fused_layers.hpp"
#include "cpu_train_kernels.hpp"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cmath>
#include <stdexcept>

namespace areal::kernels::fused {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The two-dimensional contiguous float32 view the loops read: [rows, last dimension].
at::Tensor rows_of(const at::Tensor& t) {
  return t.contiguous().view({-1, t.size(-1)});
}

struct rms_norm_function : torch::autograd::Function<rms_norm_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    auto x2 = rows_of(x);
    auto w = weight.contiguous();
    auto rows = x2.size(0), n = x2.size(1);
    auto y = at::empty_like(x2);
    auto rstd = at::empty({rows}, x2.options());
    cpu::rms_norm_forward(x2.data_ptr<float>(), w.data_ptr<float>(), static_cast<float>(eps), rows, n,
                          y.data_ptr<float>(), rstd.data_ptr<float>());
    ctx->save_for_backward({x2, w, rstd});
    return y.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto &x2 = saved[0], &w = saved[1], &rstd = saved[2];
    auto dy = rows_of(grads[0]);
    auto dx = at::empty_like(x2);
    auto dw = at::empty_like(w);
    cpu::rms_norm_backward(dy.data_ptr<float>(), x2.data_ptr<float>(), w.data_ptr<float>(), rstd.data_ptr<float>(),
                           x2.size(0), x2.size(1), dx.data_ptr<float>(), dw.data_ptr<float>());
    return {dx.view(grads[0].sizes()), dw, at::Tensor()};
  }
};

struct swiglu_function : torch::autograd::Function<swiglu_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    auto gu = gate_up.contiguous();
    auto rows = gu.size(0), width = gu.size(1) / 2;
    auto out = at::empty({rows, width}, gu.options());
    cpu::swiglu_forward(gu.data_ptr<float>(), rows, width, out.data_ptr<float>());
    ctx->save_for_backward({gu});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto gu = ctx->get_saved_variables()[0];
    auto d = grads[0].contiguous();
    auto d_gu = at::empty_like(gu);
    cpu::swiglu_backward(d.data_ptr<float>(), gu.data_ptr<float>(), gu.size(0), gu.size(1) / 2, d_gu.data_ptr<float>());
    return {d_gu};
  }
};

struct rotary_function : torch::autograd::Function<rotary_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t rotated, int64_t head_dim) {
    auto x2 = x.contiguous();
    auto c = cos.contiguous(), s = sin.contiguous();
    auto y = at::empty_like(x2);
    cpu::rotary(x2.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(), x2.size(0), x2.size(1), rotated,
                head_dim, false, y.data_ptr<float>());
    ctx->save_for_backward({c, s});
    ctx->saved_data["rotated"] = rotated;
    ctx->saved_data["head_dim"] = head_dim;
    return y;
  }

  // The rotation is orthogonal per pair of columns: its gradient is the inverse rotation.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto dy = grads[0].contiguous();
    auto dx = at::empty_like(dy);
    cpu::rotary(dy.data_ptr<float>(), saved[0].data_ptr<float>(), saved[1].data_ptr<float>(), dy.size(0), dy.size(1),
                ctx->saved_data["rotated"].toInt(), ctx->saved_data["head_dim"].toInt(), true, dx.data_ptr<float>());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct causal_attention_function : torch::autograd::Function<causal_attention_function> {
  static cpu::causal_attention_args args(const at::Tensor& qkv, const at::Tensor& cu, const at::Tensor& parents,
                                         int64_t heads, int64_t kv_heads, int64_t head_dim, at::Tensor& out,
                                         at::Tensor& lse) {
    cpu::causal_attention_args a{qkv.data_ptr<float>(),
                                 qkv.size(1),
                                 heads,
                                 kv_heads,
                                 head_dim,
                                 static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))),
                                 cu.data_ptr<int64_t>(),
                                 cu.numel() - 1,
                                 out.data_ptr<float>(),
                                 lse.data_ptr<float>()};
    if (parents.numel() > 0)
      a.parents = parents.data_ptr<int64_t>();
    return a;
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, const std::vector<int64_t>& cu_seqlens,
                            const std::vector<int64_t>& parent_of, int64_t heads, int64_t kv_heads, int64_t head_dim) {
    auto rows = qkv.contiguous();
    auto cu = at::tensor(cu_seqlens, at::TensorOptions().dtype(at::kLong));
    auto parents = at::tensor(parent_of, at::TensorOptions().dtype(at::kLong));
    auto out = at::empty({rows.size(0), heads * head_dim}, rows.options());
    auto lse = at::empty({rows.size(0), heads}, rows.options());
    cpu::causal_attention_forward(args(rows, cu, parents, heads, kv_heads, head_dim, out, lse));
    ctx->save_for_backward({rows, out, lse, cu, parents});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["head_dim"] = head_dim;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto &rows = saved[0], &out = saved[1], &lse = saved[2], &cu = saved[3], &parents = saved[4];
    auto heads = ctx->saved_data["heads"].toInt(), head_dim = ctx->saved_data["head_dim"].toInt();
    auto d_out = grads[0].contiguous();
    auto delta = (d_out * out).view({out.size(0), heads, head_dim}).sum(-1).contiguous();
    auto d_qkv = at::empty_like(rows);
    cpu::causal_attention_backward(
        args(rows, cu, parents, heads, ctx->saved_data["kv_heads"].toInt(), head_dim, out, lse),
        d_out.data_ptr<float>(), delta.data_ptr<float>(), d_qkv.data_ptr<float>());
    return {d_qkv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// y = x w^T (+ b), whose backward adds w's and b's gradients into their
// buffers in place (one product with beta = 1) instead of returning them to
// autograd: a returned gradient was a fresh tensor (zeroed by OpenBLAS before
// the product) that AccumulateGrad then added to the buffer, two more passes
// over every weight per micro-batch. The bias is optional, not undefined:
// LibTorch 1.13 refuses an undefined tensor among a node's inputs.
struct linear_function : torch::autograd::Function<linear_function> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& b) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["w_grad"] = w.grad();
    if (b)
      ctx->saved_data["b_grad"] = b->grad();
    return b ? at::addmm(*b, x, w.t()) : at::mm(x, w.t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto &x = saved[0], &w = saved[1];
    auto& dy = grads[0];
    ctx->saved_data["w_grad"].toTensor().addmm_(dy.t(), x);
    if (ctx->saved_data.count("b_grad"))
      ctx->saved_data["b_grad"].toTensor().add_(dy.sum(0));
    return {ctx->needs_input_grad(0) ? dy.mm(w) : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::atomic<bool> enabled_flag{true};

}  // namespace

bool applies(const at::Tensor& t) {
  return enabled() && t.scalar_type() == at::kFloat && t.device().is_cpu();
}

void set_enabled(bool on) {
  enabled_flag = on;
}

bool enabled() {
  return enabled_flag.load(std::memory_order_relaxed);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return rms_norm_function::apply(x, weight, eps);
}

at::Tensor swiglu(const at::Tensor& gate_up) {
  return swiglu_function::apply(gate_up);
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotated,
                  int64_t head_dim) {
  return rotary_function::apply(x, cos, sin, rotated, head_dim);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  auto accumulates = [](const at::Tensor& p) { return !p.defined() || (p.requires_grad() && p.grad().defined()); };
  // Not under autocast (bfloat16 compute): the products' dtypes are autocast's to choose.
  if (x.dim() != 2 || !applies(x) || !at::GradMode::is_enabled() || at::autocast::is_cpu_enabled() || !w.defined() ||
      !accumulates(w) || !accumulates(b))
    return at::linear(x, w, b);
  return linear_function::apply(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt);
}

bool attention_applies(const at::Tensor& qkv, int64_t head_dim) {
  return applies(qkv) && cpu::causal_attention_supported(head_dim);
}

at::Tensor causal_attention(const at::Tensor& qkv, const std::vector<int64_t>& cu_seqlens, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, const std::vector<int64_t>& parents) {
  if (!parents.empty())
    if (auto why = cpu::check_parents(cu_seqlens, parents); !why.empty())
      throw std::invalid_argument("causal_attention: " + why);
  return causal_attention_function::apply(qkv, cu_seqlens, parents, heads, kv_heads, head_dim);
}

}  // namespace areal::kernels::fused
