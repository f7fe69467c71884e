// The NCCL bulk link (nccl_link.hpp).
#include "nccl_link.hpp"

#include <stdexcept>

#ifdef AREAL_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <ATen/ATen.h>

#include <cstring>
#include <thread>

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

class nccl_link final : public bulk_link {
 public:
  nccl_link(const ncclUniqueId& id, int rank, std::chrono::milliseconds timeout) : rank_(rank), timeout_(timeout) {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
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

  void send_version(const weight_manifest& m, const at::Tensor* bytes, chunk_sums* sums,
                    const chunk_tamper& tamper) override {
    int64_t header = bytes ? m.version : -1;
    send(&header, sizeof(header));
    if (!bytes)
      return;
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
    int64_t header = 0;
    recv(&header, sizeof(header));
    if (header != m.version)
      return false;
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

std::unique_ptr<bulk_link> make_nccl_link(const std::string& unique_id_hex, int rank,
                                          std::chrono::milliseconds timeout) {
  return std::make_unique<nccl_link>(from_hex(unique_id_hex), rank, timeout);
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

std::unique_ptr<bulk_link> make_nccl_link(const std::string&, int, std::chrono::milliseconds) {
  throw std::runtime_error(missing);
}

}  // namespace areal

#endif
