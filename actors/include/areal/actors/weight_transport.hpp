// Bulk weight transport: how a new policy version travels from the trainer's
// node to the rollout workers (ARCHITECTURE.md §3). CAF carries the control
// plane (manifest, requests, reports); the bytes go
//   in-process  by pointer (the trainer's immutable snapshot),
//   gloo        over a point-to-point c10d ProcessGroupGloo link per subscriber,
//   nccl        over a two-rank NCCL communicator per subscriber (builds that
//               found CUDA and NCCL; the unique id travels in the subscribe
//               reply): from the trainer's GPU into the rollout node's GPU as
//               the versions lie there, or through GPU staging buffers for
//               versions in host memory,
//   caf         as chunk replies (the fallback, and the repair path of every backend).
// Every version is chunked, and every chunk travels with the XXH3-64 of its
// bytes, computed by the sender as it sends (on the GPU for a version there): the receiver checks each one and fetches
// a damaged chunk again (once; a second failure is reported). A subscriber that falls behind skips to the newest
// version. The publisher's `publish` reply is the handle of a transfer: it completes when every subscriber reported,
// with an error per subscriber that failed or missed the deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"

namespace areal {

enum class weight_backend : uint8_t { caf, gloo, nccl };
const char* to_string(weight_backend x);
std::optional<weight_backend> parse_weight_backend(const std::string& name);
/// Whether this build and machine can use the backend (nccl: built with NCCL and a GPU present; gloo:
/// built where Gloo's headers were found).
bool weight_backend_available(weight_backend x);
/// The bulk link kinds this process can take as a subscriber, space-separated ("gloo nccl", "gloo",
/// ""): told to the publisher when it subscribes. Empty where `allow_bulk` is false (CAF messages only).
std::string accepted_links(bool allow_bulk);

/// The bulk link a publisher configured with `configured` offers a subscriber that takes `accepted`
/// (accepted_links'): the configured one where both sides can run it. NCCL gives way to Gloo where
/// either side cannot run it (the weights then travel from host memory), Gloo to CAF messages.
/// `nccl_here` / `gloo_here`: whether the publisher's side can run them. `why`: empty when the
/// configured link is offered, else the reasons and what is offered instead, for the log.
weight_backend offered_link(weight_backend configured, const std::string& accepted, bool nccl_here, bool gloo_here,
                            std::string& why);

/// The build of the chunk checksum that runs on this CPU ("XXH3-64 (AVX2)", ...), for machine facts.
const char* chunk_checksum_kind();

struct weight_publisher_setup {
  std::string name = "trainer";                   // this node, in reports and traces
  weight_backend backend = weight_backend::gloo;  // offered to remote subscribers
  std::string host = "127.0.0.1";                 // where the Gloo rendezvous and links listen
  /// Where the published versions lie (the trainer's model's device, "cpu" or "cuda:N"): a GPU's
  /// versions go out over NCCL links as they lie; Gloo links and CAF fetches read a host copy.
  std::string device = "cpu";
  uint64_t chunk_bytes = uint64_t{4} << 20;       // transfer chunk size
  std::chrono::milliseconds timeout{60000};       // per version and subscriber
  std::vector<tensor_entry> tensors;              // the manifest's layout of the buffer (may be empty)
  /// Test hook: may alter a chunk as it is sent (version, chunk index, bytes),
  /// to show that the receiver detects it.
  std::function<void(int64_t, uint64_t, std::string&)> tamper;
};

weight_publisher_actor spawn_weight_publisher(caf::actor_system& sys, weight_publisher_setup setup);

/// Where a trainer on `model_device` keeps the versions it publishes over `backend`
/// (weight_publisher_setup::device): on its GPU where NCCL links can send them from there (the
/// backend is nccl, this build has NCCL and the process sees a GPU), else in host memory ("cpu").
std::string published_device(weight_backend backend, const std::string& model_device);

/// A version to publish: a copy of the trainer's `flat` buffer on `device` (published_device's), its
/// writing finished on a GPU before any link reads it.
local_weights publishable_copy(int64_t version, const at::Tensor& flat, const std::string& device);

struct weight_subscriber_setup {
  std::string node;                       // this node's name, as the publisher reports it
  caf::actor publisher;                   // a weight_publisher_actor, usually remote
  std::vector<caf::actor> sinks;          // rollout workers of this node: each gets local_weights
  weights_listener_actor listener;        // optional: gets (weights_atom, version, error) after each version
  uint64_t expected_bytes = 0;            // the local model's buffer size; 0: accept any
  std::string device_host = "127.0.0.1";  // this node's address for the Gloo link
  /// Where received versions are kept: on a GPU ("cuda:N") an NCCL link receives into GPU memory and
  /// the rollout workers copy from there device to device; otherwise host memory.
  std::string device = "cpu";
  bool allow_bulk = true;                 // false: always fetch over CAF, whatever link is offered
  std::chrono::milliseconds timeout{60000};
};

/// A scheduled actor: a bulk (Gloo, NCCL) receive blocks one scheduler thread
/// for the transfer, bounded by `timeout`. Not detached on purpose: CAF 0.17
/// does not let an actor system shut down while another node still holds a
/// handle to one of its detached actors, which hung teardown under load.
weight_subscriber_actor spawn_weight_subscriber(caf::actor_system& sys, weight_subscriber_setup setup);

}  // namespace areal
