// The NCCL bulk link (bulk_link.hpp): two ranks of one NCCL communicator, the
// publisher's node rank 0. The unique id is made by the publisher and travels
// to the subscriber in the subscribe reply (CAF). Chunks pass through a GPU
// staging buffer (this build's LibTorch keeps the weights in host memory).
// Built when CMake found CUDA and NCCL (AREAL_HAVE_NCCL); otherwise both
// functions throw std::runtime_error saying so.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bulk_link.hpp"

namespace areal {

/// True when this build has NCCL and the process sees a GPU.
bool nccl_available();

/// A new communicator id, hex-encoded. Throws without NCCL or GPU.
std::string nccl_unique_id();

/// Joins the communicator as `rank` (0 sends, 1 receives); blocks until both
/// ranks joined. Throws std::runtime_error after `timeout` or on any failure.
std::unique_ptr<bulk_link> make_nccl_link(const std::string& unique_id_hex, int rank,
                                          std::chrono::milliseconds timeout);

}  // namespace areal
