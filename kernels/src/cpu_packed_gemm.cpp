// cpu::pack_weight / cpu::packed_product (cpu_packed_gemm.hpp).
//
// Blocking: a thread takes whole column blocks of 32 outputs (two panels) and
// runs every row of x against each: the block's weights come from memory
// once and stay in cache for the next rows. R rows at a time keep R x 32
// accumulators in registers (AVX-512: 8 rows, 16 of the 32 registers; AVX2:
// 3 rows, 12 of 16); each step over k loads the block's 32 weights once and
// one value of each row, broadcast. The epilogue scales each row (an RMSNorm
// folded in), adds the bias or what y holds, or, for a SwiGLU packing, writes
// silu(gate) * up from the block's two panels.
#include "cpu_packed_gemm.hpp"
#include "cpu_balanced.hpp"
#include "cpu_vectors.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace areal::kernels::cpu {

namespace {

constexpr int64_t panel = 16;  // output columns per panel
constexpr int64_t block = 32;  // output columns per block: two panels

int64_t blocks_of(int64_t n) {
  return (n + block - 1) / block;
}

// Output columns a block of the product writes: 32, or 16 with SwiGLU (its two panels are gate and up).
int64_t block_outputs(const packed_product_args& a) {
  return a.swiglu ? panel : block;
}

template <typename V, int R>
AREAL_INLINE void product_body(const packed_product_args& a, int64_t b0, int64_t b1, int64_t fetch_end,
                               const float* zeros) {
  constexpr int W = width<V>, CB = block / W;
  const int64_t k = a.k;
  for (int64_t b = b0; b < b1; ++b) {
    const float* base = a.packed + b * block * k;  // the block's two panels, one after the other
    const float* bp[CB];
#pragma GCC unroll 4
    for (int v = 0; v < CB; ++v)
      bp[v] = base + (v * W / panel) * panel * k + (v * W) % panel;
    const int64_t col0 = b * block_outputs(a), cols = std::min(block_outputs(a), a.n - col0);
    // The next block's weights, fetched into L2 a line at a time over this
    // block's row blocks after the first: its first rows then find them there
    // instead of waiting on memory (the first row block reads this block's own).
    const float* next = b + 1 < fetch_end ? base + block * k : nullptr;
    const float* next_end = next ? next + block * k : nullptr;
    const int64_t row_blocks = (a.m + R - 1) / R;
    const int64_t every = row_blocks > 1 ? std::max<int64_t>(1, ((row_blocks - 1) * k) / (2 * k)) : 0;
    int64_t countdown = every;
    for (int64_t r0 = 0; r0 < a.m; r0 += R) {
      const float* xr[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        xr[r] = r0 + r < a.m ? a.x + (r0 + r) * a.x_stride : zeros;  // rows past m read zeros
      V acc[R][CB] = {};
      const bool fetch = next && r0 > 0 && next < next_end;
#pragma GCC unroll 4
      for (int64_t c = 0; c < k; ++c) {
        if (fetch && --countdown == 0 && next < next_end) {
          __builtin_prefetch(next, 0, 2);
          next += panel;  // one 64-byte line
          countdown = every;
        }
        V w[CB];
#pragma GCC unroll 4
        for (int v = 0; v < CB; ++v)
          w[v] = load<V>(bp[v] + c * panel);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          float s = xr[r][c];
#pragma GCC unroll 4
          for (int v = 0; v < CB; ++v)
            acc[r][v] += s * w[v];
        }
      }
      const int64_t rows = std::min<int64_t>(R, a.m - r0);
      for (int64_t r = 0; r < rows; ++r) {
        if (a.row_scale) {
          float scale = a.row_scale[r0 + r];
#pragma GCC unroll 4
          for (int v = 0; v < CB; ++v)
            acc[r][v] *= scale;
        }
        float* yr = a.y + (r0 + r) * a.y_stride + col0;
        if (a.swiglu) {
          float gate[panel], up[panel];
#pragma GCC unroll 4
          for (int v = 0; v < CB / 2; ++v) {
            store(gate + v * W, acc[r][v]);
            store(up + v * W, acc[r][CB / 2 + v]);
          }
          if (cols == panel) {
#pragma omp simd
            for (int64_t j = 0; j < panel; ++j)
              yr[j] = gate[j] * sigmoid(gate[j]) * up[j];
          } else {  // the last block of a width that is not a multiple of 16
            for (int64_t j = 0; j < cols; ++j)
              yr[j] = gate[j] * sigmoid(gate[j]) * up[j];
          }
        } else if (cols == block) {
#pragma GCC unroll 4
          for (int v = 0; v < CB; ++v) {
            V out = acc[r][v];
            if (a.bias)
              out += load<V>(a.bias + col0 + v * W);
            if (a.accumulate)
              out += load<V>(yr + v * W);
            store(yr + v * W, out);
          }
        } else {  // the last block of an n that is not a multiple of 32
          float tmp[block];
          for (int v = 0; v < CB; ++v)
            store(tmp + v * W, acc[r][v]);
          for (int64_t j = 0; j < cols; ++j)
            yr[j] = (a.accumulate ? yr[j] : 0.0f) + tmp[j] + (a.bias ? a.bias[col0 + j] : 0.0f);
        }
      }
    }
  }
}

AREAL_AVX512 void product_avx512(const packed_product_args& a, int64_t b0, int64_t b1, int64_t fetch_end,
                                 const float* zeros) {
  product_body<f32x16, 8>(a, b0, b1, fetch_end, zeros);
}

AREAL_AVX2 void product_avx2(const packed_product_args& a, int64_t b0, int64_t b1, int64_t fetch_end,
                             const float* zeros) {
  product_body<f32x8, 3>(a, b0, b1, fetch_end, zeros);
}

void product_baseline(const packed_product_args& a, int64_t b0, int64_t b1, int64_t fetch_end, const float* zeros) {
  product_body<f32x8, 1>(a, b0, b1, fetch_end, zeros);
}

}  // namespace

int64_t packed_size(int64_t n, int64_t k) {
  return blocks_of(n) * block * k;
}

namespace {

// Panel p's column j is row source(p, j) of w (-1: zeros), times column_scale.
template <typename F>
void pack_panels(const float* w, int64_t k, int64_t panels, const float* column_scale, float* packed, F source) {
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* out = packed + p * panel * k;
      for (int64_t j = 0; j < panel; ++j) {
        int64_t row = source(p, j);
        const float* src = row >= 0 ? w + row * k : nullptr;
        for (int64_t c = 0; c < k; ++c)
          out[c * panel + j] = src ? src[c] * (column_scale ? column_scale[c] : 1.0f) : 0.0f;
      }
    }
  });
}

}  // namespace

void pack_weight(const float* w, int64_t n, int64_t k, float* packed, const float* column_scale) {
  pack_panels(w, k, blocks_of(n) * (block / panel), column_scale, packed, [n](int64_t p, int64_t j) {
    int64_t row = p * panel + j;
    return row < n ? row : int64_t{-1};
  });
}

int64_t packed_swiglu_size(int64_t width, int64_t k) {
  return (width + panel - 1) / panel * block * k;
}

void pack_swiglu(const float* w, int64_t width, int64_t k, float* packed, const float* column_scale) {
  pack_panels(w, k, (width + panel - 1) / panel * 2, column_scale, packed, [width](int64_t p, int64_t j) {
    int64_t column = (p / 2) * panel + j;  // panel 2b: the gate's columns of block b; 2b + 1: the up's
    return column < width ? (p % 2) * width + column : int64_t{-1};
  });
}

void packed_product(const packed_product_args& a) {
  if (a.m <= 0 || a.n <= 0)
    return;
  std::vector<float> zeros(static_cast<size_t>(a.k), 0.0f);
  // A task's blocks: at least about 64k multiply-adds, or the start of a task outweighs them.
  int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, block * a.k * a.m));
  int64_t blocks = (a.n + block_outputs(a) - 1) / block_outputs(a);
  auto body = [&](int64_t b0, int64_t b1, int64_t fetch_end) {
    denormals_flushed flushed;
    if (cpu_isa == isa::avx512)
      product_avx512(a, b0, b1, fetch_end, zeros.data());
    else if (cpu_isa == isa::avx2)
      product_avx2(a, b0, b1, fetch_end, zeros.data());
    else
      product_baseline(a, b0, b1, fetch_end, zeros.data());
  };
  balanced_for(blocks, grain, body);
}

}  // namespace areal::kernels::cpu
