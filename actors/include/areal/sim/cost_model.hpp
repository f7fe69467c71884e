// What things cost in a simulated run (simulation.hpp): one decode step of a
// rollout engine, a prefill, a training step, a weight transfer, a reward.
// Each cost is a small formula over a model shape and a device, and every
// parameter carries the source it comes from (a datasheet, a measurement, a
// figure the paper states about its setup, or an assumption said as such), so
// that a report can print them. No actor logic.
//
// Two kinds of device:
//  - a GPU roofline: a decode step takes max(bytes read / HBM bandwidth,
//    FLOPs / FLOP rate) + a fixed overhead; dense passes (prefill, training)
//    run at a stated fraction of the peak FLOP rate;
//  - measured here: the same formulas with the rates this machine's CPU
//    showed (bench_simulate measures them in the same run).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace areal::sim {

/// The dimensions of a decoder-only transformer (Qwen2 layout: grouped-query
/// attention, gated MLP).
struct model_shape {
  std::string name;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  bool tied_embeddings = false;
  int64_t tensor_parallel = 1;  // devices per rollout engine
  std::string source;

  /// Parameters (embeddings included).
  double parameters() const;
  /// FLOPs of one token's forward pass without attention over the context: 2 per weight
  /// of the matrices it multiplies (the input embedding is a lookup).
  double forward_flops_per_token() const;
  /// FLOPs of attending from one token over `context` tokens (scores and weighted values).
  double attention_flops(double context) const;
  /// Bytes of the KV cache of one token at `bytes_per_value`.
  double kv_bytes_per_token(double bytes_per_value) const;
};

/// Qwen2 shapes by name: qwen2-1.5b, qwen2-7b, qwen2-14b, qwen2-32b. Throws
/// std::invalid_argument naming the known ones.
const model_shape& qwen2_shape(const std::string& name);
std::vector<std::string> qwen2_names();

/// A rate with the source it comes from.
struct sourced {
  double value = 0;
  std::string source;
};

/// One kind of device and the fabric between nodes.
struct device_model {
  std::string name;
  sourced memory_bandwidth;  // bytes/s a decode step streams at
  sourced flop_rate;         // FLOP/s of the matrix products of a decode step
  sourced dense_fraction;    // share of flop_rate that prefill and training passes reach
  sourced step_overhead;     // seconds every decode step costs besides its reads and FLOPs
  sourced memory_bytes;      // per device
  sourced bytes_per_value;   // of weights and KV cache (2: bf16)
  sourced devices_per_node;
  sourced link_bandwidth;    // bytes/s from the trainer to one receiving node
  sourced link_latency;      // seconds per weight transfer
};

/// The datasheet rooflines: H800 (the paper's GPUs) and H200, by name "h800" or "h200".
device_model gpu_device(const std::string& name);

/// What a simulated run asks of its costs. Two implementations: the GPU
/// roofline (roofline_costs) and a fit of this machine's measurements (fitted_costs).
class cost_model {
 public:
  virtual ~cost_model() = default;
  /// One decode step of an engine: `batch` sequences whose contexts hold `context_tokens` in all.
  virtual double decode_step_seconds(int64_t batch, double context_tokens) const = 0;
  /// Prefill of `tokens` new tokens that attend over `attended` tokens in all
  /// (a fresh prompt of n tokens: tokens = n, attended = n(n+1)/2).
  virtual double prefill_seconds(double tokens, double attended) const = 0;
  /// One training step over sequences of these total lengths (prompt +
  /// response) on `devices` devices: forward, backward and the proximal pass.
  virtual double train_seconds(const std::vector<int64_t>& sequence_lengths, int64_t devices) const = 0;
  /// New weights from the trainer to one receiving node.
  virtual double transfer_seconds() const = 0;
  /// Sequence tokens one engine's KV cache holds.
  virtual double kv_capacity_tokens() const = 0;
  /// Devices one rollout engine spans.
  virtual int64_t devices_per_engine() const { return 1; }
  /// Devices of one node (weights are transferred once per node).
  virtual int64_t devices_per_node() const { return 1; }
  /// The parameters and their sources, one per line.
  virtual std::string describe() const = 0;

  /// On one CPU node the rollout engine and the trainer share the cores, so
  /// each runs slower while the other computes: the costs then. nullptr (the
  /// default): devices of their own, as GPUs.
  virtual const cost_model* when_sharing() const { return nullptr; }
};

/// A model on a GPU: decode steps are bound by memory bandwidth or FLOPs,
/// dense passes run at the device's dense fraction of its peak.
class roofline_costs final : public cost_model {
 public:
  roofline_costs(model_shape shape, device_model device);
  double decode_step_seconds(int64_t batch, double context_tokens) const override;
  double prefill_seconds(double tokens, double attended) const override;
  double train_seconds(const std::vector<int64_t>& sequence_lengths, int64_t devices) const override;
  double transfer_seconds() const override;
  double kv_capacity_tokens() const override;
  int64_t devices_per_engine() const override { return shape_.tensor_parallel; }
  int64_t devices_per_node() const override;
  std::string describe() const override;
  double weight_bytes() const;

 private:
  model_shape shape_;
  device_model device_;
};

/// Costs fitted to measurements of the real engine and trainer on this
/// machine (bench_simulate measures them): linear in what each step does.
struct measured_rates {
  // decode step = base + per_sequence * batch + per_context * context tokens
  double decode_base = 0, decode_per_sequence = 0, decode_per_context = 0;
  // prefill = per_token * tokens + per_attended * attended
  double prefill_per_token = 0, prefill_per_attended = 0;
  // training step = base + per_token * tokens + per_attended * sum of length^2 / 2
  double train_base = 0, train_per_token = 0, train_per_attended = 0;
  double transfer = 0;  // seconds per version to the rollout workers (in-process: the snapshot)
  std::string source;   // where and how they were measured
};

/// With `shared` rates (the same steps timed while the other side computes),
/// the engine and the trainer share one node's cores (when_sharing()).
class fitted_costs final : public cost_model {
 public:
  explicit fitted_costs(measured_rates rates, std::optional<measured_rates> shared = std::nullopt);
  double decode_step_seconds(int64_t batch, double context_tokens) const override;
  double prefill_seconds(double tokens, double attended) const override;
  double train_seconds(const std::vector<int64_t>& sequence_lengths, int64_t devices) const override;
  double transfer_seconds() const override { return rates_.transfer; }
  double kv_capacity_tokens() const override;
  std::string describe() const override;
  const cost_model* when_sharing() const override { return sharing_.get(); }
  const measured_rates& rates() const { return rates_; }

 private:
  measured_rates rates_;
  std::shared_ptr<const fitted_costs> sharing_;
};

/// Least squares of y over the columns of x (rows of equal length); the
/// coefficients, each clamped at 0 (a cost cannot fall as work grows).
std::vector<double> fit_nonnegative(const std::vector<std::vector<double>>& x, const std::vector<double>& y);

}  // namespace areal::sim
