// A point-to-point Gloo link between two processes: LibTorch's bundled c10d
// ProcessGroupGloo with two ranks (0 sends, 1 receives), met through the
// authenticated rendezvous store that the sending node hosts
// (rendezvous_store.hpp: only peers holding the run's secret get in). One link per subscriber, so that a
// subscriber that dies or joins late never stalls the others (a collective
// broadcast would tie every receiver to the slowest). Kept out of the headers
// that many files include: c10d's headers are heavy.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "bulk_link.hpp"

namespace at {
class Tensor;
}  // namespace at

namespace areal {

/// True when this build has the Gloo link (gloo_link.cpp); false where Gloo's
/// headers were not found at build time (gloo_link_absent.cpp: every
/// constructor below throws std::runtime_error saying so).
bool gloo_available();
/// Why this build has no Gloo link, and what to do; empty when it has one.
const char* gloo_absent_reason();

/// The rendezvous of a node's Gloo links: an authenticated store on an ephemeral
/// port of the node's topology address, with a fresh secret.
class gloo_rendezvous {
 public:
  /// Listens on `host`, port chosen by the system. Throws std::runtime_error.
  gloo_rendezvous(const std::string& host, std::chrono::milliseconds timeout);
  ~gloo_rendezvous();
  uint16_t port() const;
  const std::string& host() const { return host_; }
  /// What a receiving side must present; travels only over the control plane.
  const std::string& secret() const;
  /// Connections refused for not proving the secret.
  uint64_t refused() const;
  /// The sending side of the link with `prefix` (every link's: "") stops waiting for its receiving side
  /// (its constructor throws at once): for a receiver that is gone or will never come.
  void abandon(const std::string& prefix);

  struct impl;

 private:
  std::string host_;
  std::unique_ptr<impl> impl_;
};

class gloo_link final : public bulk_link {
 public:
  /// The sending side (rank 0), on the node that hosts `rendezvous`. Blocks until
  /// the receiving side joined; throws std::runtime_error after `timeout`.
  gloo_link(gloo_rendezvous& rendezvous, const std::string& prefix, std::chrono::milliseconds timeout);
  /// The receiving side (rank 1): connects to the rendezvous at host:port with its secret.
  gloo_link(const std::string& host, uint16_t port, const std::string& secret, const std::string& prefix,
            const std::string& device_host, std::chrono::milliseconds timeout);
  ~gloo_link() override;

  const char* backend() const override { return "gloo"; }
  /// Chunk i goes with tag 2i+1 and its checksum with tag 2i+2 (0 is the header);
  /// every transfer is posted at once, so checksums overlap the bytes in flight.
  void send_version(const weight_manifest& m, const at::Tensor* bytes, chunk_sums* sums,
                    const chunk_tamper& tamper) override;
  bool receive_version(const weight_manifest& m, at::Tensor& buffer, std::vector<uint64_t>& bad) override;

  /// Blocking transfers of a contiguous byte tensor, matched by tag. Throw on
  /// timeout or a broken connection; the link is unusable afterwards.
  void send(const at::Tensor& bytes, int tag);
  void recv(at::Tensor& bytes, int tag);

  /// Non-blocking: the transfer is queued and Gloo's thread moves the bytes
  /// while the caller goes on (e.g. checksums the previous chunk). The tensor
  /// must stay alive until wait(index) returned. Returns the index to wait on.
  size_t post_send(const at::Tensor& bytes, int tag);
  size_t post_recv(at::Tensor& bytes, int tag);
  /// Waits for one posted transfer; throws like send and recv.
  void wait(size_t index);
  /// Forgets the posted transfers (all waited for).
  void clear_posted();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace areal
