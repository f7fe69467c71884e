// The cost formulas of simulated runs (cost_model.hpp) and where each number comes from.
#include "areal/sim/cost_model.hpp"

#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace areal::sim {

double model_shape::parameters() const {
  double per_layer = hidden * double(heads * head_dim) + heads * head_dim  // q and its bias
                     + 2.0 * (hidden * double(kv_heads * head_dim) + kv_heads * head_dim)  // k, v
                     + double(heads * head_dim) * hidden                                   // o
                     + 3.0 * hidden * double(intermediate)                                 // gate, up, down
                     + 2.0 * hidden;                                                       // norms
  double embeddings = double(vocab) * hidden * (tied_embeddings ? 1 : 2);
  return layers * per_layer + embeddings + hidden;
}

double model_shape::forward_flops_per_token() const {
  // Every weight but the input embedding's lookup takes part in one multiply-add;
  // with tied embeddings the output head multiplies by the embedding matrix.
  double lookup = double(vocab) * hidden;
  double multiplied = parameters() - lookup - hidden * (2.0 * layers + 1) + (tied_embeddings ? lookup : 0);
  return 2 * multiplied;
}

double model_shape::attention_flops(double context) const {
  return 4.0 * layers * double(heads * head_dim) * context;  // q.k and the weighted sum of v
}

double model_shape::kv_bytes_per_token(double bytes_per_value) const {
  return 2.0 * layers * double(kv_heads * head_dim) * bytes_per_value;
}

namespace {

const std::map<std::string, model_shape>& shapes() {
  static const std::map<std::string, model_shape> known = [] {
    const char* config = "config.json of Qwen2.5-Math-1.5B / Qwen2.5-7B / -14B / -32B (the DeepSeek-R1-Distill-Qwen "
                         "models the paper trains share them)";
    const char* tp = "; tensor parallel per engine: an assumption (what fits 80 GB with room for the KV cache)";
    std::map<std::string, model_shape> m;
    m["qwen2-1.5b"] = {"qwen2-1.5b", 28, 1536, 12, 2, 128, 8960, 151936, true, 1, std::string{config} + tp};
    m["qwen2-7b"] = {"qwen2-7b", 28, 3584, 28, 4, 128, 18944, 152064, false, 1, std::string{config} + tp};
    m["qwen2-14b"] = {"qwen2-14b", 48, 5120, 40, 8, 128, 13824, 152064, false, 2, std::string{config} + tp};
    m["qwen2-32b"] = {"qwen2-32b", 64, 5120, 40, 8, 128, 27648, 152064, false, 4, std::string{config} + tp};
    return m;
  }();
  return known;
}

}  // namespace

const model_shape& qwen2_shape(const std::string& name) {
  auto it = shapes().find(name);
  if (it == shapes().end()) {
    std::string known;
    for (auto& n : qwen2_names())
      known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model shape \"" + name + "\"; known: " + known);
  }
  return it->second;
}

std::vector<std::string> qwen2_names() {
  std::vector<std::string> out;
  for (auto& [name, shape] : shapes())
    out.push_back(name);
  return out;
}

device_model gpu_device(const std::string& name) {
  // Shared by both: what was measured on an H200 (ARCHITECTURE.md section 7) as a
  // share of its datasheet, and what the paper states about its setup.
  const double copy_share = 4.3 / 4.8;   // device-to-device copy measured vs HBM datasheet
  const double gemm_share = 790.0 / 989;  // bf16 GEMM measured vs dense datasheet peak
  device_model d;
  d.dense_fraction = {454.7 / 989,
                      "454.7 TFLOP/s per GPU, the paper's 7B training throughput with dynamic micro-batching on "
                      "H800, over the 989 TFLOP/s peak (H200 has the same compute)"};
  d.step_overhead = {0.002,
                     "assumption: 2 ms per decode step for launches and scheduling (not measured: no GPU was lent); "
                     "bench_simulate prints the sensitivity"};
  d.bytes_per_value = {2, "bf16 weights and KV cache (the paper's setup)"};
  d.devices_per_node = {8, "8 GPUs per node (the paper's setup)"};
  d.link_bandwidth = {50e9,
                      "assumption: one 400 Gb/s NIC per node carries the weights from the trainer to each "
                      "receiving node in turn"};
  d.link_latency = {0.2, "assumption: 0.2 s per transfer to announce, verify and load the weights"};
  if (name == "h800") {
    d.name = "H800";
    d.memory_bandwidth = {3.35e12 * copy_share,
                          "3.35 TB/s HBM3 (H800 SXM datasheet) x 0.90, the share of its datasheet bandwidth an H200 "
                          "reached in a measured device copy"};
    d.flop_rate = {989e12 * gemm_share,
                   "989 TFLOP/s dense bf16 (datasheet) x 0.80, the share an H200 reached in a measured GEMM"};
    d.memory_bytes = {80e9, "80 GB HBM3 (datasheet)"};
  } else if (name == "h200") {
    d.name = "H200";
    d.memory_bandwidth = {4.3e12, "4.3 TB/s: device-to-device copy measured on an H200 (4.8 TB/s datasheet)"};
    d.flop_rate = {790e12, "790 TFLOP/s: bf16 GEMM measured on an H200 (989 datasheet)"};
    d.memory_bytes = {141e9, "141 GB HBM3e (datasheet)"};
  } else {
    throw std::invalid_argument("unknown device \"" + name + "\"; known: h800, h200 (or measured)");
  }
  return d;
}

roofline_costs::roofline_costs(model_shape shape, device_model device)
    : shape_(std::move(shape)), device_(std::move(device)) {
  if (kv_capacity_tokens() < 1)
    throw std::invalid_argument(fmt::format("{} does not fit on {} device(s) of {} ({:.0f} GB of weights)",
                                            shape_.name, shape_.tensor_parallel, device_.name, weight_bytes() / 1e9));
}

double roofline_costs::weight_bytes() const {
  return shape_.parameters() * device_.bytes_per_value.value;
}

double roofline_costs::decode_step_seconds(int64_t batch, double context_tokens) const {
  double tp = double(shape_.tensor_parallel);
  double bytes = weight_bytes() + shape_.kv_bytes_per_token(device_.bytes_per_value.value) * context_tokens;
  double flops = double(batch) * shape_.forward_flops_per_token() + shape_.attention_flops(context_tokens);
  return std::max(bytes / (device_.memory_bandwidth.value * tp), flops / (device_.flop_rate.value * tp)) +
         device_.step_overhead.value;
}

double roofline_costs::prefill_seconds(double tokens, double attended) const {
  double rate = 989e12 * device_.dense_fraction.value * double(shape_.tensor_parallel);
  return (tokens * shape_.forward_flops_per_token() + shape_.attention_flops(attended)) / rate;
}

double roofline_costs::train_seconds(const std::vector<int64_t>& lengths, int64_t devices) const {
  double flops = 0;
  for (auto n : lengths)
    flops += double(n) * shape_.forward_flops_per_token() + shape_.attention_flops(0.5 * double(n) * double(n + 1));
  // Forward and backward: 3 forward passes' FLOPs; the proximal pass: 1 more.
  return 4 * flops / (989e12 * device_.dense_fraction.value * double(std::max<int64_t>(devices, 1)));
}

double roofline_costs::transfer_seconds() const {
  return device_.link_latency.value + weight_bytes() / device_.link_bandwidth.value;
}

double roofline_costs::kv_capacity_tokens() const {
  double free = 0.9 * device_.memory_bytes.value * double(shape_.tensor_parallel) - weight_bytes();
  return free / shape_.kv_bytes_per_token(device_.bytes_per_value.value);
}

int64_t roofline_costs::devices_per_node() const {
  return static_cast<int64_t>(device_.devices_per_node.value);
}

std::string roofline_costs::describe() const {
  std::ostringstream os;
  auto& d = device_;
  os << fmt::format("model {}: {:.2f} B parameters, {:.2f} GFLOP per token, {:.0f} KB KV cache per token, {} device(s) "
                    "per engine\n  source: {}\n",
                    shape_.name, shape_.parameters() / 1e9, shape_.forward_flops_per_token() / 1e9,
                    shape_.kv_bytes_per_token(d.bytes_per_value.value) / 1e3, shape_.tensor_parallel, shape_.source);
  auto line = [&](const char* what, const sourced& s, double scale, const char* unit) {
    os << fmt::format("{} {}: {:.4g} {}\n  source: {}\n", d.name, what, s.value / scale, unit, s.source);
  };
  line("memory bandwidth", d.memory_bandwidth, 1e12, "TB/s");
  line("matrix FLOP rate", d.flop_rate, 1e12, "TFLOP/s");
  line("dense passes (prefill, training) at", d.dense_fraction, 0.01, "% of 989 TFLOP/s");
  line("decode step overhead", d.step_overhead, 1e-3, "ms");
  line("memory", d.memory_bytes, 1e9, "GB");
  line("bytes per value", d.bytes_per_value, 1, "");
  line("devices per node", d.devices_per_node, 1, "");
  line("weight link", d.link_bandwidth, 1e9, "GB/s");
  line("weight transfer latency", d.link_latency, 1, "s");
  os << fmt::format("derived: KV capacity {:.0f} tokens per engine; weight transfer {:.2f} s per node\n",
                    kv_capacity_tokens(), transfer_seconds());
  return os.str();
}

namespace {

std::string describe_rates(const measured_rates& r) {
  return fmt::format(
      "decode step = {:.3g} ms + {:.3g} ms x batch + {:.3g} us x context tokens\n"
      "  prefill = {:.3g} us x token + {:.3g} ns x attended\n"
      "  training step = {:.3g} ms + {:.3g} us x token + {:.3g} ns x attended\n"
      "  weights to the workers: {:.3g} ms per version\n  source: {}\n",
      r.decode_base * 1e3, r.decode_per_sequence * 1e3, r.decode_per_context * 1e6, r.prefill_per_token * 1e6,
      r.prefill_per_attended * 1e9, r.train_base * 1e3, r.train_per_token * 1e6, r.train_per_attended * 1e9,
      r.transfer * 1e3, r.source);
}

}  // namespace

fitted_costs::fitted_costs(measured_rates rates, std::optional<measured_rates> shared)
    : rates_(std::move(rates)), sharing_(shared ? std::make_shared<fitted_costs>(std::move(*shared)) : nullptr) {}

double fitted_costs::decode_step_seconds(int64_t batch, double context_tokens) const {
  return rates_.decode_base + rates_.decode_per_sequence * double(batch) + rates_.decode_per_context * context_tokens;
}

double fitted_costs::prefill_seconds(double tokens, double attended) const {
  return rates_.prefill_per_token * tokens + rates_.prefill_per_attended * attended;
}

double fitted_costs::train_seconds(const std::vector<int64_t>& lengths, int64_t devices) const {
  double tokens = 0, attended = 0;
  for (auto n : lengths) {
    tokens += double(n);
    attended += 0.5 * double(n) * double(n + 1);
  }
  return (rates_.train_base + rates_.train_per_token * tokens + rates_.train_per_attended * attended) /
         double(std::max<int64_t>(devices, 1));
}

double fitted_costs::kv_capacity_tokens() const {
  return 1e12;  // a CPU engine's cache lives in host memory: the controller's slots bound it
}

std::string fitted_costs::describe() const {
  auto text = std::string{sharing_ ? "measured here, each side alone: " : "measured here: "} + describe_rates(rates_);
  if (sharing_)
    text += "measured here, while the other side computes on the same cores: " + describe_rates(sharing_->rates_);
  return text;
}

std::vector<double> fit_nonnegative(const std::vector<std::vector<double>>& x, const std::vector<double>& y) {
  size_t k = x.empty() ? 0 : x[0].size();
  std::vector<bool> active(k, true);
  std::vector<double> beta(k, 0.0);
  // Normal equations over the active columns; a column whose coefficient comes
  // out negative leaves and the rest are fitted again.
  for (size_t round = 0; round <= k; ++round) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < k; ++j)
      if (active[j])
        cols.push_back(j);
    size_t m = cols.size();
    std::vector<std::vector<double>> a(m, std::vector<double>(m + 1, 0.0));
    for (size_t r = 0; r < x.size(); ++r)
      for (size_t i = 0; i < m; ++i) {
        for (size_t j = 0; j < m; ++j)
          a[i][j] += x[r][cols[i]] * x[r][cols[j]];
        a[i][m] += x[r][cols[i]] * y[r];
      }
    for (size_t i = 0; i < m; ++i) {  // Gauss-Jordan with partial pivoting
      size_t p = i;
      for (size_t r = i + 1; r < m; ++r)
        if (std::abs(a[r][i]) > std::abs(a[p][i]))
          p = r;
      std::swap(a[i], a[p]);
      if (std::abs(a[i][i]) < 1e-300)
        continue;
      for (size_t r = 0; r < m; ++r)
        if (r != i) {
          double f = a[r][i] / a[i][i];
          for (size_t c = i; c <= m; ++c)
            a[r][c] -= f * a[i][c];
        }
    }
    std::fill(beta.begin(), beta.end(), 0.0);
    bool negative = false;
    for (size_t i = 0; i < m; ++i) {
      double b = std::abs(a[i][i]) < 1e-300 ? 0.0 : a[i][m] / a[i][i];
      beta[cols[i]] = b;
      if (b < 0) {
        active[cols[i]] = false;
        negative = true;
      }
    }
    if (!negative)
      break;
  }
  for (auto& b : beta)
    b = std::max(b, 0.0);
  return beta;
}

}  // namespace areal::sim
