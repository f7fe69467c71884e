// The NCCL bulk link (nccl_link.hpp).
#include "nccl_link.hpp"

#include <stdexcept>

#ifdef AREAL_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "areal/kernels/device_checksums.hpp"
#include "areal/messages/codec.hpp"

namespace areal {

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string{"NCCL link: "} + what + ": " + cudaGetErrorString(e));
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw std::runtime_error(std::string{"NCCL link: "} + what + ": " + ncclGetErrorString(r));
}

std::string to_hex(const ncclUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : id.internal) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

ncclUniqueId from_hex(const std::string& hex) {
  ncclUniqueId id{};
  if (hex.size() != 2 * sizeof(id.internal))
    throw std::runtime_error("NCCL link: malformed unique id");
  for (size_t i = 0; i < sizeof(id.internal); ++i)
    id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return id;
}

// Chunks of a version per NCCL group: each chunk is two operations (its bytes, its checksum), and a
// group is enqueued as one launch.
constexpr uint64_t chunks_per_group = 64;

class nccl_link final : public bulk_link {
 public:
  nccl_link(const ncclUniqueId& id, int rank, int gpu, std::chrono::milliseconds timeout)
      : rank_(rank), gpu_(gpu), timeout_(timeout) {
    check_cuda(cudaSetDevice(gpu_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Non-blocking initialisation, so that a peer that never comes is a timeout, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, 2, id, rank, &config), "ncclCommInitRank");
    await_comm("joining the communicator");
  }

  ~nccl_link() override {
    if (comm_)
      ncclCommAbort(comm_);
    if (staging_)
      cudaFree(staging_);
    if (stream_)
      cudaStreamDestroy(stream_);
  }

  const char* backend() const override { return "nccl"; }
  bool reads_device_memory() const override { return true; }

  void send_version(const weight_manifest& m, const at::Tensor* bytes, chunk_sums* sums,
                    const chunk_tamper& tamper) override {
    on_gpu();
    int64_t header = bytes ? m.version : -1;
    send(&header, sizeof(header));
    if (!bytes)
      return;
    if (bytes->is_cuda()) {
      if (tamper)
        throw std::logic_error("NCCL link: the tamper hook needs the version in host memory");
      send_from_gpu(m, *bytes, *sums);
      return;
    }
    auto* data = static_cast<const char*>(bytes->data_ptr());
    for (uint64_t i = 0; i < m.chunk_count(); ++i) {
      auto [first, size] = chunk_range(m, i);
      uint64_t sum = sums->get(i, data + first, size);
      if (tamper) {
        std::string copy(data + first, size);
        tamper(m.version, i, copy);
        send(copy.data(), size);
      } else {
        send(data + first, size);
      }
      send(&sum, sizeof(sum));
    }
  }

  bool receive_version(const weight_manifest& m, at::Tensor& buffer, std::vector<uint64_t>& bad) override {
    on_gpu();
    int64_t header = 0;
    recv(&header, sizeof(header));
    if (header != m.version)
      return false;
    if (buffer.is_cuda()) {
      receive_into_gpu(m, buffer, bad);
      return true;
    }
    auto* data = static_cast<char*>(buffer.data_ptr());
    for (uint64_t i = 0; i < m.chunk_count(); ++i) {
      auto [first, size] = chunk_range(m, i);
      recv(data + first, size);
      uint64_t sum = 0;
      recv(&sum, sizeof(sum));
      if (chunk_checksum(data + first, size) != sum)
        bad.push_back(i);
    }
    return true;
  }

 private:
  void reserve(size_t bytes) {
    if (bytes <= staging_bytes_)
      return;
    if (staging_)
      cudaFree(staging_);
    staging_ = nullptr;
    check_cuda(cudaMalloc(&staging_, bytes), "cudaMalloc");
    staging_bytes_ = bytes;
  }

  // Polls the communicator's asynchronous state until it is ready, failed or late.
  void await_comm(const char* what) {
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &state), what);
      if (state == ncclSuccess)
        return;
      if (state != ncclInProgress)
        check_nccl(state, what);
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(std::string{"NCCL link: "} + what + " timed out");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Waits for the stream; a peer that died is a timeout (the communicator is then aborted).
  void await_stream(const char* what) {
    await_comm(what);
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      auto e = cudaStreamQuery(stream_);
      if (e == cudaSuccess)
        return;
      if (e != cudaErrorNotReady)
        check_cuda(e, what);
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress)
        check_nccl(state, what);
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(std::string{"NCCL link: "} + what + " timed out");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // The link's calls come from whichever thread runs its actor: each sets the communicator's GPU.
  void on_gpu() { check_cuda(cudaSetDevice(gpu_), "cudaSetDevice"); }

  void require_on_link_gpu(const at::Tensor& t) const {
    if (t.device().index() != gpu_)
      throw std::runtime_error("NCCL link: a version on GPU " + std::to_string(t.device().index()) +
                               " given to the link of GPU " + std::to_string(gpu_));
  }

  static uint64_t checksum_chunk_bytes(const weight_manifest& m) {
    return std::max<uint64_t>(1, chunk_range(m, 0).second);
  }

  // Chunks [first, last) as one NCCL group: each chunk's bytes at `data`, then its checksum (8 bytes at
  // `checksums`), sent or received in the order the other side, grouped or not, goes through them.
  template <typename op>
  void grouped_chunks(const weight_manifest& m, char* data, int64_t* checksums, op transfer, const char* what) {
    for (uint64_t first = 0; first < m.chunk_count(); first += chunks_per_group) {
      uint64_t last = std::min(m.chunk_count(), first + chunks_per_group);
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (uint64_t i = first; i < last; ++i) {
        auto [offset, size] = chunk_range(m, i);
        check_nccl(transfer(data + offset, size), what);
        check_nccl(transfer(checksums + i, sizeof(int64_t)), what);
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
      await_comm(what);  // the group is enqueued before the next one starts
    }
    await_stream(what);
  }

  // From the trainer's GPU buffer: no copy to the host. The checksums are computed on the GPU (one pass
  // over the version) by the first link that sends it and recorded for the others and the CAF path's
  // repairs. The trainer synchronized its GPU after making the snapshot (publishable_copy), and the
  // checksums' copy between host and GPU waits for the kernels that made them: NCCL's own stream sends
  // complete bytes and sums.
  void send_from_gpu(const weight_manifest& m, const at::Tensor& bytes, chunk_sums& sums) {
    require_on_link_gpu(bytes);
    auto chunks = static_cast<int64_t>(m.chunk_count());
    auto on_host = at::empty({chunks}, at::kLong);
    bool all_known = true;
    for (int64_t i = 0; i < chunks && all_known; ++i) {
      auto sum = sums.known(static_cast<uint64_t>(i));
      all_known = sum.has_value();
      on_host.data_ptr<int64_t>()[i] = static_cast<int64_t>(sum.value_or(0));
    }
    at::Tensor checksums;
    if (all_known) {
      checksums = on_host.to(bytes.device());
    } else {
      checksums = kernels::chunk_checksums_on_device(bytes.view(-1), checksum_chunk_bytes(m));
      on_host = checksums.cpu();
      for (int64_t i = 0; i < chunks; ++i)
        sums.put(static_cast<uint64_t>(i), static_cast<uint64_t>(on_host.data_ptr<int64_t>()[i]));
    }
    grouped_chunks(
        m, static_cast<char*>(bytes.data_ptr()), checksums.data_ptr<int64_t>(),
        [this](void* p, size_t n) { return ncclSend(p, n, ncclUint8, 1 - rank_, comm_, stream_); }, "ncclSend");
  }

  // Into the rollout node's GPU buffer; its checksums computed there once every chunk is in.
  void receive_into_gpu(const weight_manifest& m, at::Tensor& buffer, std::vector<uint64_t>& bad) {
    require_on_link_gpu(buffer);
    auto sent = at::empty({static_cast<int64_t>(m.chunk_count())}, buffer.options().dtype(at::kLong));
    // NCCL writes on a stream of its own, which orders after nothing of LibTorch's: the buffer's last
    // readers (the rollout workers' copies of the previous version, on their threads' streams) and the
    // work before these blocks were freed to the caching allocator must be done first.
    check_cuda(cudaDeviceSynchronize(), "waiting for the buffer's readers");
    grouped_chunks(
        m, static_cast<char*>(buffer.data_ptr()), sent.data_ptr<int64_t>(),
        [this](void* p, size_t n) { return ncclRecv(p, n, ncclUint8, 1 - rank_, comm_, stream_); }, "ncclRecv");
    auto computed = kernels::chunk_checksums_on_device(buffer.view(-1), checksum_chunk_bytes(m));
    auto differ = computed.ne(sent).nonzero().view(-1).cpu();
    for (int64_t k = 0; k < differ.numel(); ++k)
      bad.push_back(static_cast<uint64_t>(differ.data_ptr<int64_t>()[k]));
  }

  void send(const void* host, size_t bytes) {
    reserve(bytes);
    check_cuda(cudaMemcpyAsync(staging_, host, bytes, cudaMemcpyHostToDevice, stream_), "copy to the GPU");
    check_nccl(ncclSend(staging_, bytes, ncclUint8, 1 - rank_, comm_, stream_), "ncclSend");
    await_stream("send");
  }

  void recv(void* host, size_t bytes) {
    reserve(bytes);
    check_nccl(ncclRecv(staging_, bytes, ncclUint8, 1 - rank_, comm_, stream_), "ncclRecv");
    check_cuda(cudaMemcpyAsync(host, staging_, bytes, cudaMemcpyDeviceToHost, stream_), "copy from the GPU");
    await_stream("receive");
  }

  int rank_;
  int gpu_;
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

}  // namespace

bool nccl_available() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

std::string nccl_unique_id() {
  if (!nccl_available())
    throw std::runtime_error("cluster.weight_transport = \"nccl\" needs a GPU, and this node has none");
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return to_hex(id);
}

std::unique_ptr<bulk_link> make_nccl_link(const std::string& unique_id_hex, int rank, int gpu,
                                          std::chrono::milliseconds timeout) {
  return std::make_unique<nccl_link>(from_hex(unique_id_hex), rank, gpu, timeout);
}

}  // namespace areal

#else  // no NCCL in this build

namespace areal {

namespace {
const char* missing =
    "this areal build has no NCCL (CMake found no CUDA runtime and NCCL); use "
    "cluster.weight_transport = \"gloo\"";
}  // namespace

bool nccl_available() {
  return false;
}

std::string nccl_unique_id() {
  throw std::runtime_error(missing);
}

std::unique_ptr<bulk_link> make_nccl_link(const std::string&, int, int, std::chrono::milliseconds) {
  throw std::runtime_error(missing);
}

}  // namespace areal

#endif
