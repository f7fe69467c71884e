#include "bench_common.hpp"

#include <ATen/ATen.h>

#include "areal/kernels/compute_threads.hpp"

namespace areal::bench {

double concurrent_gemm_ceiling_gflops(const kernels::model_config& c, int threads) {
  std::vector<double> rates(static_cast<size_t>(threads));
  std::vector<std::thread> running;
  for (int k = 0; k < threads; ++k)
    running.emplace_back([&, k] {
      kernels::set_compute_threads(1);
      rates[static_cast<size_t>(k)] = gemm_ceiling_gflops(c);
    });
  for (auto& t : running)
    t.join();
  double sum = 0;
  for (auto r : rates)
    sum += r;
  return sum;
}

namespace {

double layer_matrix_parameters(const kernels::model_config& c) {
  double h = static_cast<double>(c.hidden_size);
  double attention_width = static_cast<double>(c.num_attention_heads * c.head_dim());
  double kv_width = static_cast<double>(c.num_key_value_heads * c.head_dim());
  return h * attention_width + 2 * h * kv_width + attention_width * h + 3 * h * static_cast<double>(c.intermediate_size);
}

}  // namespace

double decode_flops(const kernels::model_config& c, int64_t batch, int64_t context) {
  double h = static_cast<double>(c.hidden_size), layers = static_cast<double>(c.num_hidden_layers);
  double attention_width = static_cast<double>(c.num_attention_heads * c.head_dim());
  double per_token = 2.0 * layers * layer_matrix_parameters(c) + 2.0 * h * static_cast<double>(c.vocab_size) +
                     layers * 2.0 * 2.0 * attention_width * static_cast<double>(context + 1);
  return per_token * static_cast<double>(batch);
}

double forward_flops(const kernels::model_config& c, const std::vector<int64_t>& lengths, int64_t scored) {
  double h = static_cast<double>(c.hidden_size), attention_width = static_cast<double>(c.num_attention_heads * c.head_dim());
  double layer_matrices = layer_matrix_parameters(c);
  double layers = static_cast<double>(c.num_hidden_layers);
  double flops = 2.0 * static_cast<double>(scored) * h * static_cast<double>(c.vocab_size);
  for (auto length : lengths) {
    double l = static_cast<double>(length);
    flops += 2.0 * layers * layer_matrices * l;
    flops += layers * 2.0 * 2.0 * attention_width * l * (l + 1) / 2.0;
  }
  return flops;
}

}  // namespace areal::bench
