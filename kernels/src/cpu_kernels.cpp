#include "cpu_kernels.hpp"
#include "cpu_isa.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace areal::kernels::cpu {

namespace {

// e[i] = exp(x[i] * inv_t - top); returns their sum.
AREAL_INLINE float exp_sum_body(const float* x, float* e, int64_t n, float inv_t, float top) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    e[i] = exp_nonpositive(x[i] * inv_t - top);
    sum += e[i];
  }
  return sum;
}

float exp_sum_baseline(const float* x, float* e, int64_t n, float inv_t, float top) {
  return exp_sum_body(x, e, n, inv_t, top);
}
AREAL_AVX2 float exp_sum_avx2(const float* x, float* e, int64_t n, float inv_t, float top) {
  return exp_sum_body(x, e, n, inv_t, top);
}
AREAL_AVX512 float exp_sum_avx512(const float* x, float* e, int64_t n, float inv_t, float top) {
  return exp_sum_body(x, e, n, inv_t, top);
}

float exp_sum(const float* x, float* e, int64_t n, float inv_t, float top) {
  switch (cpu_isa) {
    case isa::avx512:
      return exp_sum_avx512(x, e, n, inv_t, top);
    case isa::avx2:
      return exp_sum_avx2(x, e, n, inv_t, top);
    default:
      return exp_sum_baseline(x, e, n, inv_t, top);
  }
}

// The `count` largest of e[0, vocab), most probable first (ties: lower id
// first), by selection on a copy of the values: O(vocab), no full sort.
std::vector<int64_t> top_indices(const std::vector<float>& e, int64_t vocab, int64_t count) {
  thread_local std::vector<float> values;
  values.assign(e.begin(), e.begin() + vocab);
  std::nth_element(values.begin(), values.begin() + (count - 1), values.end(), std::greater<>());
  float threshold = values[static_cast<size_t>(count - 1)];
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  int64_t above = 0;
  for (int64_t i = 0; i < vocab; ++i)
    above += e[static_cast<size_t>(i)] > threshold;
  int64_t ties_allowed = count - above;
  for (int64_t i = 0; i < vocab; ++i) {
    float v = e[static_cast<size_t>(i)];
    if (v > threshold || (v == threshold && ties_allowed-- > 0))
      out.push_back(i);
  }
  std::sort(out.begin(), out.end(), [&](int64_t x, int64_t y) {
    auto ex = e[static_cast<size_t>(x)], ey = e[static_cast<size_t>(y)];
    return ex != ey ? ex > ey : x < y;
  });
  return out;
}

}  // namespace

row_sample sample_row(const float* logits, int64_t vocab, float temperature, bool greedy, int64_t top_k, float top_p,
                      double uniform) {
  denormals_flushed flushed;
  float inv_t = temperature > 0 ? 1.0f / temperature : 1.0f;
  int64_t best = 0;
  float top = logits[0];
  for (int64_t i = 0; i < vocab; ++i) {
    float x = logits[i];
    if (!std::isfinite(x))
      throw std::runtime_error("sampling: logit " + std::to_string(i) + " is " + std::to_string(x) +
                               "; the model produced NaN or infinite values (diverged weights?)");
    if (x > top) {
      top = x;
      best = i;
    }
  }
  thread_local std::vector<float> e;
  if (e.size() < static_cast<size_t>(vocab))
    e.resize(static_cast<size_t>(vocab));
  float scaled_top = top * inv_t;
  float total = exp_sum(logits, e.data(), vocab, inv_t, scaled_top);
  float log_normalizer = scaled_top + std::log(total);
  auto result = [&](int64_t token) { return row_sample{token, logits[token] * inv_t - log_normalizer}; };
  if (greedy || temperature <= 0)
    return result(best);

  auto draw = [&](auto&& candidate, int64_t count, double mass) {
    double target = uniform * mass, acc = 0;
    int64_t last = candidate(0);
    for (int64_t i = 0; i < count; ++i) {
      auto id = candidate(i);
      float w = e[static_cast<size_t>(id)];
      if (w <= 0)
        continue;
      last = id;
      acc += w;
      if (acc > target)
        return id;
    }
    return last;  // rounding left the target just above the summed mass
  };
  bool cut_k = top_k > 0 && top_k < vocab, cut_p = top_p < 1.0f;
  if (!cut_k && !cut_p)
    return result(draw([](int64_t i) { return i; }, vocab, total));

  // Candidates most probable first: the top k, or (top-p alone) a growing top
  // set until it holds the nucleus.
  int64_t count = cut_k ? top_k : std::min<int64_t>(64, vocab);
  for (;;) {
    auto ids = top_indices(e, vocab, count);
    double reference = cut_k ? 0.0 : static_cast<double>(total);  // top-p renormalizes within the top k
    if (cut_k)
      for (auto id : ids)
        reference += e[static_cast<size_t>(id)];
    int64_t keep = count;
    bool complete = !cut_p;
    if (cut_p) {
      double before = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (before / reference >= top_p) {
          keep = i;
          complete = true;
          break;
        }
        before += e[static_cast<size_t>(ids[static_cast<size_t>(i)])];
      }
      if (count == vocab || cut_k)
        complete = true;  // every candidate there is was considered
    }
    if (complete) {
      double mass = 0;
      for (int64_t i = 0; i < keep; ++i)
        mass += e[static_cast<size_t>(ids[static_cast<size_t>(i)])];
      return result(draw([&](int64_t i) { return ids[static_cast<size_t>(i)]; }, keep, mass));
    }
    count = std::min(vocab, count * 4);
  }
}

}  // namespace areal::kernels::cpu
