// The NCCL bulk link (bulk_link.hpp): two ranks of one NCCL communicator, the
// publisher's node rank 0. The unique id is made by the publisher and travels
// to the subscriber in the subscribe reply (CAF). A version in GPU memory (the
// trainer's snapshot on its GPU, a rollout node's receive buffer on its GPU)
// travels from and into it as it lies, its chunks' checksums computed on the
// GPU (areal/kernels/device_checksums.hpp); a version in host memory passes
// chunk by chunk through a GPU staging buffer.
// Built when CMake found CUDA and NCCL (AREAL_HAVE_NCCL); otherwise both
// functions throw std::runtime_error saying so.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bulk_link.hpp"

namespace areal {

/// The GPU a device name gives the NCCL link ("cuda:1": 1; "cuda", or not a GPU: 0).
/// (weight_backends.cpp, beside the backend names both sides share.)
int gpu_of(const std::string& device);

/// True when this build has NCCL and the process sees a GPU.
bool nccl_available();

/// A new communicator id, hex-encoded. Throws without NCCL or GPU.
std::string nccl_unique_id();

/// Joins the communicator as `rank` (0 sends, 1 receives) on CUDA device `gpu` (where the versions
/// it sends or receives in GPU memory lie); blocks until both ranks joined. Throws
/// std::runtime_error after `timeout` or on any failure.
std::unique_ptr<bulk_link> make_nccl_link(const std::string& unique_id_hex, int rank, int gpu,
                                          std::chrono::milliseconds timeout);

}  // namespace areal
