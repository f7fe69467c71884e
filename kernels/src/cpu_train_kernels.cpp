#include "cpu_train_kernels.hpp"
#include "cpu_isa.hpp"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace areal::kernels::cpu {

namespace {

// Rows per task when rows are split over intra-op threads: enough work to
// outweigh a task's start.
int64_t grain(int64_t n) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n));
}

AREAL_INLINE void rms_forward_rows_body(const float* x, const float* w, float eps, int64_t begin, int64_t end,
                                        int64_t n, float* y, float* rstd) {
  for (int64_t r = begin; r < end; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i)
      ss += xr[i] * xr[i];
    float s = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    rstd[r] = s;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      yr[i] = xr[i] * s * w[i];
  }
}

AREAL_INLINE void inverse_rms_rows_body(const float* x, int64_t x_stride, float eps, int64_t begin, int64_t end,
                                        int64_t n, float* out) {
  for (int64_t r = begin; r < end; ++r) {
    const float* xr = x + r * x_stride;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i)
      ss += xr[i] * xr[i];
    out[r] = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  }
}

// dx = s * (dy * w) - x * s^3 * sum(dy * w * x) / n; dw += dy * x * s.
AREAL_INLINE void rms_backward_rows_body(const float* dy, const float* x, const float* w, const float* rstd,
                                         int64_t begin, int64_t end, int64_t n, float* dx, float* dw) {
  for (int64_t r = begin; r < end; ++r) {
    const float *dyr = dy + r * n, *xr = x + r * n;
    float* dxr = dx + r * n;
    float s = rstd[r], dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < n; ++i)
      dot += dyr[i] * w[i] * xr[i];
    float c = s * s * s * dot / static_cast<float>(n);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      dxr[i] = s * dyr[i] * w[i] - c * xr[i];
      dw[i] += dyr[i] * xr[i] * s;
    }
  }
}

AREAL_INLINE void swiglu_forward_rows_body(const float* gate_up, int64_t begin, int64_t end, int64_t width,
                                           float* out) {
  for (int64_t r = begin; r < end; ++r) {
    const float *g = gate_up + r * 2 * width, *u = g + width;
    float* o = out + r * width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i)
      o[i] = g[i] * sigmoid(g[i]) * u[i];
  }
}

// d/dg silu(g) = s * (1 + g * (1 - s)), s = sigmoid(g).
AREAL_INLINE void swiglu_backward_rows_body(const float* d_out, const float* gate_up, int64_t begin, int64_t end,
                                            int64_t width, float* d_gate_up) {
  for (int64_t r = begin; r < end; ++r) {
    const float *g = gate_up + r * 2 * width, *u = g + width, *d = d_out + r * width;
    float *dg = d_gate_up + r * 2 * width, *du = dg + width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) {
      float s = sigmoid(g[i]);
      du[i] = d[i] * g[i] * s;
      dg[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
  }
}

// Forward: y[i] = x[i] cos[i] - x[i + h] sin[i] (i < h), x[i] cos[i] + x[i - h] sin[i] (i >= h).
// Inverse (the transpose, for the backward pass): the partner's sine is its own index's.
AREAL_INLINE void rotary_rows_body(const float* x, const float* cos, const float* sin, int64_t begin, int64_t end,
                                   int64_t width, int64_t rotated, int64_t head_dim, bool inverse, float* y) {
  auto half = head_dim / 2;
  for (int64_t r = begin; r < end; ++r) {
    const float *xr = x + r * width, *c = cos + r * head_dim, *sn = sin + r * head_dim;
    float* yr = y + r * width;
    for (int64_t h = 0; h < rotated; h += head_dim) {
      const float* xh = xr + h;
      float* yh = yr + h;
      if (!inverse) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          yh[i] = xh[i] * c[i] - xh[i + half] * sn[i];
          yh[i + half] = xh[i + half] * c[i + half] + xh[i] * sn[i + half];
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          yh[i] = xh[i] * c[i] + xh[i + half] * sn[i + half];
          yh[i + half] = xh[i + half] * c[i + half] - xh[i] * sn[i];
        }
      }
    }
    for (int64_t i = rotated; i < width; ++i)
      yr[i] = xr[i];
  }
}

AREAL_INLINE void adamw_rows_body(float* p, float* g, float* m, float* v, int64_t begin, int64_t end,
                                  const adamw_step& a) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float gi = g[i] * a.grad_scale;
    float mi = m[i] * a.beta1 + (1.0f - a.beta1) * gi;
    float vi = v[i] * a.beta2 + (1.0f - a.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float update = (mi / a.bias1) / (std::sqrt(vi / a.bias2) + a.eps) + a.weight_decay * p[i];
    p[i] -= a.lr * update;
    g[i] = 0.0f;
  }
}

AREAL_INLINE void sum_of_squares_range_body(const float* x, int64_t begin, int64_t end, double* out) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = begin; i < end; ++i)
    sum += static_cast<double>(x[i]) * x[i];
  *out = sum;
}

// One copy of each body per instruction set; a task runs with denormals flushed.
#define AREAL_COPIES(name, params, args)   \
  void name##_baseline params {            \
    name##_body args;                      \
  }                                        \
  AREAL_AVX2 void name##_avx2 params {     \
    name##_body args;                      \
  }                                        \
  AREAL_AVX512 void name##_avx512 params { \
    name##_body args;                      \
  }                                        \
  void name params {                       \
    denormals_flushed flushed;             \
    switch (cpu_isa) {                     \
      case isa::avx512:                    \
        return name##_avx512 args;         \
      case isa::avx2:                      \
        return name##_avx2 args;           \
      default:                             \
        return name##_baseline args;       \
    }                                      \
  }

AREAL_COPIES(rms_forward_rows,
             (const float* x, const float* w, float eps, int64_t begin, int64_t end, int64_t n, float* y, float* rstd),
             (x, w, eps, begin, end, n, y, rstd))
AREAL_COPIES(inverse_rms_rows,
             (const float* x, int64_t x_stride, float eps, int64_t begin, int64_t end, int64_t n, float* out),
             (x, x_stride, eps, begin, end, n, out))
AREAL_COPIES(rms_backward_rows,
             (const float* dy, const float* x, const float* w, const float* rstd, int64_t begin, int64_t end, int64_t n,
              float* dx, float* dw),
             (dy, x, w, rstd, begin, end, n, dx, dw))
AREAL_COPIES(swiglu_forward_rows, (const float* gate_up, int64_t begin, int64_t end, int64_t width, float* out),
             (gate_up, begin, end, width, out))
AREAL_COPIES(swiglu_backward_rows,
             (const float* d_out, const float* gate_up, int64_t begin, int64_t end, int64_t width, float* d_gate_up),
             (d_out, gate_up, begin, end, width, d_gate_up))
AREAL_COPIES(rotary_rows,
             (const float* x, const float* cos, const float* sin, int64_t begin, int64_t end, int64_t width,
              int64_t rotated, int64_t head_dim, bool inverse, float* y),
             (x, cos, sin, begin, end, width, rotated, head_dim, inverse, y))
AREAL_COPIES(adamw_rows, (float* p, float* g, float* m, float* v, int64_t begin, int64_t end, const adamw_step& a),
             (p, g, m, v, begin, end, a))
AREAL_COPIES(sum_of_squares_range, (const float* x, int64_t begin, int64_t end, double* out), (x, begin, end, out))
#undef AREAL_COPIES

}  // namespace

void rms_norm_forward(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y, float* rstd) {
  at::parallel_for(0, rows, grain(n),
                   [&](int64_t begin, int64_t end) { rms_forward_rows(x, w, eps, begin, end, n, y, rstd); });
}

void inverse_rms(const float* x, int64_t x_stride, int64_t rows, int64_t n, float eps, float* out) {
  at::parallel_for(0, rows, grain(n),
                   [&](int64_t begin, int64_t end) { inverse_rms_rows(x, x_stride, eps, begin, end, n, out); });
}

void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows, int64_t n,
                       float* dx, float* dw) {
  // Each task sums its rows' dw into a row of its own; the rows are added at the end.
  auto step = grain(n);
  auto tasks = (rows + step - 1) / step;
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(tasks, 1) * n), 0.0f);
  at::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t)
      rms_backward_rows(dy, x, w, rstd, t * step, std::min(rows, (t + 1) * step), n, dx, partial.data() + t * n);
  });
  std::fill(dw, dw + n, 0.0f);
  for (int64_t t = 0; t < tasks; ++t)
    for (int64_t i = 0; i < n; ++i)
      dw[i] += partial[static_cast<size_t>(t * n + i)];
}

void swiglu_forward(const float* gate_up, int64_t rows, int64_t width, float* out) {
  at::parallel_for(0, rows, grain(width),
                   [&](int64_t begin, int64_t end) { swiglu_forward_rows(gate_up, begin, end, width, out); });
}

void swiglu_backward(const float* d_out, const float* gate_up, int64_t rows, int64_t width, float* d_gate_up) {
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    swiglu_backward_rows(d_out, gate_up, begin, end, width, d_gate_up);
  });
}

void rotary(const float* x, const float* cos, const float* sin, int64_t rows, int64_t width, int64_t rotated,
            int64_t head_dim, bool inverse, float* y) {
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    rotary_rows(x, cos, sin, begin, end, width, rotated, head_dim, inverse, y);
  });
}

void adamw(float* p, float* g, float* m, float* v, int64_t begin, int64_t end, const adamw_step& a) {
  adamw_rows(p, g, m, v, begin, end, a);
}

double sum_of_squares(const float* x, int64_t begin, int64_t end) {
  double sum = 0;
  sum_of_squares_range(x, begin, end, &sum);
  return sum;
}

}  // namespace areal::kernels::cpu
