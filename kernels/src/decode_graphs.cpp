#include "decode_graphs.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "areal/kernels/kv_cache.hpp"
#include "torch_compat.hpp"

#if AREAL_CUDA_GRAPHS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace areal::kernels {

int64_t graph_key_bucket(int64_t needed, int64_t max_len) {
  // Multiples of 256, or of an eighth of the context's power of two beyond 2048:
  // at most 256 keys or 1/8 more than needed are read, in at most ~70 buckets.
  int64_t power = 1;
  while (power * 2 <= needed)
    power *= 2;
  int64_t step = std::max<int64_t>(256, power / 8);
  return std::min(max_len, (needed + step - 1) / step * step);
}

int64_t graph_batch_bucket(int64_t n, int64_t slots) {
  int64_t batch = 1;
  while (batch < n)
    batch *= 2;
  return std::min(batch, slots);
}

#if AREAL_CUDA_GRAPHS

struct decode_graphs::state {
  struct captured {
    at::cuda::CUDAGraph graph;
    at::Tensor inputs;  // [2, batch]: tokens, then positions
    at::Tensor out;     // the graph's hidden states [batch, hidden]
  };
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<captured>> graphs;  // by (batch, keys)
  std::optional<c10::cuda::CUDAStream> stream;  // capture needs a stream other than the default
  decltype(at::cuda::graph_pool_handle()) pool{};
  const void* weights = nullptr;
  const void* storage = nullptr;
};

bool decode_graphs::available() {
  return true;
}

decode_graphs::decode_graphs() : state_(std::make_unique<state>()) {}
decode_graphs::~decode_graphs() = default;

std::optional<at::Tensor> decode_graphs::run(kv_cache& cache, const std::vector<int64_t>& tokens,
                                             const std::vector<int64_t>& positions, const void* weights,
                                             const step_body& body) {
  auto n = static_cast<int64_t>(tokens.size());
  auto batch = graph_batch_bucket(n, cache.slots());
  if (n == 0 || n > batch)
    return std::nullopt;
  std::vector<int64_t> packed(static_cast<size_t>(2 * batch), 0);
  int64_t needed = 0;
  for (int64_t i = 0; i < batch; ++i) {
    auto at = static_cast<size_t>(i);
    // A padding row decodes token 0 in its slot at the slot's length: a position
    // the slot's sequence (if any) writes before it reads.
    auto position = i < n ? positions[at] : cache.length[at];
    if (position >= cache.rows())
      return std::nullopt;
    packed[at] = i < n ? tokens[at] : 0;
    packed[static_cast<size_t>(batch + i)] = position;
    needed = std::max(needed, position + 1);
  }
  auto keys = graph_key_bucket(needed, cache.rows());

  auto& s = *state_;
  const void* storage = cache.keys.empty() ? nullptr : cache.keys[0].data_ptr();
  if (weights != s.weights || storage != s.storage) {
    s.graphs.clear();  // they read parameters or a cache that are gone
    s.weights = weights;
    s.storage = storage;
  }
  auto device = cache.keys[0].device();
  c10::cuda::CUDAGuard device_guard(device);
  if (!s.stream) {
    s.stream = c10::cuda::getStreamFromPool(false, device.index());
    s.pool = at::cuda::graph_pool_handle();
  }
  auto current = c10::cuda::getCurrentCUDAStream(device.index());
  auto host = at::from_blob(packed.data(), {2, batch}, at::TensorOptions().dtype(at::kLong));

  // The capture stream starts after what the current stream has queued (the
  // cache's slot moves, the previous step's sampling) and the current stream
  // reads the result only after it.
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(*s.stream);
  at::Tensor out;
  {
    c10::cuda::CUDAStreamGuard on_capture_stream(*s.stream);
    auto& entry = s.graphs[{batch, keys}];
    if (!entry) {
      // First step of these buckets: computed eagerly (which also sets up what a
      // first call sets up, outside the capture), then recorded, not run.
      auto made = std::make_unique<state::captured>();
      made->inputs = at::empty({2, batch}, at::TensorOptions().dtype(at::kLong).device(device));
      made->inputs.copy_(host);
      out = body(made->inputs[0], made->inputs[1], keys);
      compat::capture_begin(made->graph, s.pool);
      made->out = body(made->inputs[0], made->inputs[1], keys);
      made->graph.capture_end();
      entry = std::move(made);
      ++captures_;
    } else {
      entry->inputs.copy_(host);
      entry->graph.replay();
      out = entry->out;
      ++replays_;
    }
  }
  at::cuda::CUDAEvent done;
  done.record(*s.stream);
  done.block(current);
  // A copy on the current stream: the graph's output is overwritten by its next replay.
  return out.narrow(0, 0, n).clone();
}

#else

struct decode_graphs::state {};

bool decode_graphs::available() {
  return false;
}

decode_graphs::decode_graphs() = default;
decode_graphs::~decode_graphs() = default;

std::optional<at::Tensor> decode_graphs::run(kv_cache&, const std::vector<int64_t>&, const std::vector<int64_t>&,
                                             const void*, const step_body&) {
  return std::nullopt;
}

#endif

}  // namespace areal::kernels
