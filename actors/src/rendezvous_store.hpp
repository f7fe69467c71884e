// The key-value store where the two ends of a bulk link meet (internal to
// actors/). It replaces c10d's TCPStore, which admits anyone who reaches its
// port: this one listens only on the topology's address of its node, and
// serves only peers that prove they hold the run's secret, which the
// publisher hands out with the link over the (TLS-protected) control plane.
//
// Handshake, both ways (HMAC-SHA256 over the other side's fresh nonce, so a
// recorded exchange proves nothing later):
//   server -> client  "areal-store-1" + server nonce (32 bytes)
//   client -> server  client nonce (32) + HMAC(secret, "client" + server nonce)
//   server -> client  HMAC(secret, "server" + client nonce)
// A peer that fails it, or says nothing for handshake_timeout, is disconnected
// and counted in refused(); the store goes on serving the others.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace areal {

/// Why a store operation failed: a refused handshake, a timeout, a lost connection.
struct store_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A fresh per-run secret: 32 random bytes from OpenSSL, as 64 hex digits.
std::string make_store_secret();

class store_server {
 public:
  /// Listens on `host` (a name or an address of this machine), port chosen by
  /// the system. Throws store_error when it cannot.
  store_server(const std::string& host, std::string secret,
               std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5));
  ~store_server();
  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;

  uint16_t port() const;
  /// Connections turned away: a wrong proof, garbage, or silence.
  uint64_t refused() const;
  /// Connections that proved the secret.
  uint64_t admitted() const;
  /// Every wait (get, wait) on a key that starts with `prefix`, now or later, fails at once
  /// (store_error, "... was abandoned ..."): a link's side that waits for a peer that is gone stops
  /// waiting.
  void abandon(const std::string& prefix);

  struct state;

 private:
  std::shared_ptr<state> state_;
};

/// One authenticated connection to a store_server. Not thread-safe.
class store_client {
 public:
  /// Connects and runs the handshake; throws store_error (refused, unreachable,
  /// or the server did not prove the secret either).
  store_client(const std::string& host, uint16_t port, const std::string& secret, std::chrono::milliseconds timeout);
  ~store_client();
  store_client(const store_client&) = delete;
  store_client& operator=(const store_client&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value);
  /// Waits up to `timeout` for the key to exist.
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout);
  /// Adds to a counter (created at 0) and returns its new value.
  int64_t add(const std::string& key, int64_t delta);
  bool erase(const std::string& key);
  /// Whether every key exists now.
  bool check(const std::vector<std::string>& keys);
  /// Waits up to `timeout` for every key to exist; throws store_error past it.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  int64_t size();

 private:
  std::vector<uint8_t> call(uint8_t op, const std::vector<std::string>& keys, const std::vector<uint8_t>& value,
                            std::chrono::milliseconds timeout);
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
};

}  // namespace areal
