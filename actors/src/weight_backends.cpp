// The weight backends both sides share (weight_transport.hpp): their names,
// which this build and machine can run, which link a publisher offers a
// subscriber, and where a trainer keeps the versions it publishes.
#include <sstream>

#include <ATen/ATen.h>

#include "areal/actors/weight_transport.hpp"
#include "gloo_link.hpp"
#include "nccl_link.hpp"

namespace areal {

const char* to_string(weight_backend x) {
  switch (x) {
    case weight_backend::gloo:
      return "gloo";
    case weight_backend::nccl:
      return "nccl";
    case weight_backend::caf:
      break;
  }
  return "caf";
}

bool weight_backend_available(weight_backend x) {
  switch (x) {
    case weight_backend::nccl:
      return nccl_available();
    case weight_backend::gloo:
      return gloo_available();
    case weight_backend::caf:
      break;
  }
  return true;
}

std::optional<weight_backend> parse_weight_backend(const std::string& name) {
  if (name == "gloo")
    return weight_backend::gloo;
  if (name == "nccl")
    return weight_backend::nccl;
  if (name == "caf")
    return weight_backend::caf;
  return std::nullopt;
}

std::string accepted_links(bool allow_bulk) {
  std::string kinds;
  if (allow_bulk && weight_backend_available(weight_backend::gloo))
    kinds = "gloo";
  if (allow_bulk && weight_backend_available(weight_backend::nccl))
    kinds += kinds.empty() ? "nccl" : " nccl";
  return kinds;
}

weight_backend offered_link(weight_backend configured, const std::string& accepted, bool nccl_here, bool gloo_here,
                            std::string& why) {
  auto takes = [&](weight_backend kind) {
    std::istringstream words(accepted);
    std::string word;
    while (words >> word)
      if (word == to_string(kind))
        return true;
    return false;
  };
  why.clear();
  if (configured == weight_backend::nccl) {
    if (nccl_here && takes(weight_backend::nccl))
      return weight_backend::nccl;
    why = nccl_here ? "it cannot take an NCCL link (its build has no NCCL, or its machine no GPU)"
                    : "NCCL cannot run here (this build has no NCCL, or this machine no GPU)";
    configured = weight_backend::gloo;
    if (gloo_here && takes(weight_backend::gloo)) {
      why += "; weights travel to it over Gloo";
      return weight_backend::gloo;
    }
    why += "; ";
  }
  if (configured == weight_backend::gloo) {
    if (gloo_here && takes(weight_backend::gloo))
      return weight_backend::gloo;
    why += gloo_here ? "it takes no Gloo link (its weight_transport is \"caf\", or its build has no Gloo)"
                     : "no Gloo link here (this build has none, or its rendezvous could not start)";
    why += "; weights travel to it as CAF messages";
  }
  return weight_backend::caf;
}

std::string published_device(weight_backend backend, const std::string& model_device) {
  bool gpu = at::Device(model_device).is_cuda();
  return gpu && backend == weight_backend::nccl && weight_backend_available(backend) ? model_device : "cpu";
}

int gpu_of(const std::string& device) {
  at::Device d(device);
  return d.is_cuda() && d.has_index() ? d.index() : 0;
}

}  // namespace areal
