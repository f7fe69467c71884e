// The authenticated rendezvous store (rendezvous_store.hpp).
#include "rendezvous_store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "areal/runtime/log.hpp"

namespace areal {

namespace {

using clock_type = std::chrono::steady_clock;
using bytes = std::vector<uint8_t>;

constexpr char greeting[] = "areal-store-1";
constexpr size_t greeting_size = sizeof(greeting) - 1;
constexpr size_t nonce_size = 32;
constexpr size_t mac_size = 32;
// Bounds on what a peer may send, and on how many may be connected at once.
constexpr uint32_t max_key_bytes = 4096;
constexpr uint32_t max_value_bytes = 1u << 20;
constexpr uint32_t max_keys = 64;
constexpr size_t max_connections = 64;

enum op : uint8_t { op_set = 1, op_get, op_add, op_erase, op_check, op_wait, op_size };
enum status : uint8_t { status_ok = 0, status_timeout, status_bad_request, status_abandoned };

bytes random_bytes(size_t n) {
  bytes out(n);
  if (RAND_bytes(out.data(), static_cast<int>(n)) != 1)
    throw store_error("the rendezvous store cannot draw random bytes (OpenSSL RAND_bytes failed)");
  return out;
}

bytes mac(const std::string& secret, const char* role, const bytes& nonce) {
  bytes message(role, role + std::strlen(role));
  message.insert(message.end(), nonce.begin(), nonce.end());
  bytes out(EVP_MAX_MD_SIZE);
  unsigned int size = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message.data(), message.size(), out.data(),
       &size);
  out.resize(size);
  return out;
}

bool same(const bytes& a, const bytes& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// -- blocking I/O with a deadline ------------------------------------------------

// Waits until `fd` is ready for `events`: 1 ready, 0 not yet (ask again), -1 an error or the deadline.
int ready_for(int fd, short events, clock_type::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
  if (left <= 0)
    return -1;
  pollfd pfd{fd, events, 0};
  int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  if (ready < 0 && errno != EINTR)
    return -1;
  return ready > 0 ? 1 : 0;
}

// False on a closed connection, an error, or the deadline (a peer that stops reading).
bool write_all(int fd, const void* data, size_t size, clock_type::time_point deadline) {
  auto* p = static_cast<const char*>(data);
  while (size > 0) {
    int ready = ready_for(fd, POLLOUT, deadline);
    if (ready < 0)
      return false;
    if (ready == 0)
      continue;
    auto n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    if (n <= 0)
      return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// False on a closed connection, an error, or the deadline.
bool read_exact(int fd, void* data, size_t size, clock_type::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    int ready = ready_for(fd, POLLIN, deadline);
    if (ready < 0)
      return false;
    if (ready == 0)
      continue;
    auto n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void put_u32(bytes& out, uint32_t x) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<uint8_t>(x >> (8 * i)));
}

bool get_u32(int fd, uint32_t& x, clock_type::time_point deadline) {
  uint8_t b[4];
  if (!read_exact(fd, b, 4, deadline))
    return false;
  x = uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
  return true;
}

bool get_blob(int fd, bytes& out, uint32_t limit, clock_type::time_point deadline) {
  uint32_t n = 0;
  if (!get_u32(fd, n, deadline) || n > limit)
    return false;
  out.resize(n);
  return n == 0 || read_exact(fd, out.data(), n, deadline);
}

std::string peer_of(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return "an unknown peer";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown peer";
  return std::string{host} + ":" + port;
}

addrinfo* resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    throw store_error("rendezvous store: cannot resolve \"" + host + "\": " + ::gai_strerror(rc));
  return found;
}

}  // namespace

std::string make_store_secret() {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (auto b : random_bytes(32)) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

// -- server ------------------------------------------------------------------------

struct store_server::state {
  std::string secret;
  std::chrono::milliseconds handshake_timeout;
  int listen_fd = -1;
  uint16_t port = 0;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> refused{0}, admitted{0};

  std::mutex mutex;  // guards everything below
  std::condition_variable changed;
  std::map<std::string, bytes> values;
  std::set<std::string> abandoned;  // key prefixes whose waits fail at once (abandon)
  std::list<int> connections;  // open descriptors, shut down when stopping
  struct worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };
  std::list<worker> workers;  // one per connection; joined once done

  std::thread acceptor;

  bool handshake(int fd);
  void serve(int fd);
  bool answer(int fd, uint8_t op, uint32_t timeout_ms, const std::vector<std::string>& keys, const bytes& value);
  void accept_loop();
};

bool store_server::state::handshake(int fd) {
  auto deadline = clock_type::now() + handshake_timeout;
  auto server_nonce = random_bytes(nonce_size);
  bytes hello(greeting, greeting + greeting_size);
  hello.insert(hello.end(), server_nonce.begin(), server_nonce.end());
  if (!write_all(fd, hello.data(), hello.size(), deadline))
    return false;
  bytes client_nonce(nonce_size), proof(mac_size);
  if (!read_exact(fd, client_nonce.data(), nonce_size, deadline) || !read_exact(fd, proof.data(), mac_size, deadline))
    return false;
  if (!same(proof, mac(secret, "client", server_nonce)))
    return false;
  auto reply = mac(secret, "server", client_nonce);
  return write_all(fd, reply.data(), reply.size(), deadline);
}

bool store_server::state::answer(int fd, uint8_t op, uint32_t timeout_ms, const std::vector<std::string>& keys,
                                 const bytes& value) {
  bytes out;
  uint8_t result = status_ok;
  {
    std::unique_lock<std::mutex> lock{mutex};
    auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
    auto given_up = [&] {
      return std::any_of(keys.begin(), keys.end(), [&](auto& k) {
        return std::any_of(abandoned.begin(), abandoned.end(), [&](auto& p) { return k.rfind(p, 0) == 0; });
      });
    };
    auto all_present = [&] {
      return stopping || given_up() ||
             std::all_of(keys.begin(), keys.end(), [&](auto& k) { return values.count(k) > 0; });
    };
    switch (op) {
      case op_set:
        values[keys[0]] = value;
        changed.notify_all();
        break;
      case op_get:
      case op_wait:
        if (!changed.wait_until(lock, deadline, all_present) || stopping)
          result = status_timeout;
        else if (given_up())
          result = status_abandoned;
        else if (op == op_get)
          out = values[keys[0]];
        break;
      case op_add: {
        if (value.size() != 8) {
          result = status_bad_request;
          break;
        }
        int64_t delta = 0, now = 0;
        std::memcpy(&delta, value.data(), 8);
        if (auto it = values.find(keys[0]); it != values.end() && it->second.size() == 8)
          std::memcpy(&now, it->second.data(), 8);
        now = static_cast<int64_t>(static_cast<uint64_t>(now) + static_cast<uint64_t>(delta));  // wraps, never UB
        out.resize(8);
        std::memcpy(out.data(), &now, 8);
        values[keys[0]] = out;
        changed.notify_all();
        break;
      }
      case op_erase:
        out.push_back(values.erase(keys[0]) > 0 ? 1 : 0);
        break;
      case op_check:
        out.push_back(std::all_of(keys.begin(), keys.end(), [&](auto& k) { return values.count(k) > 0; }) ? 1 : 0);
        break;
      case op_size: {
        int64_t n = static_cast<int64_t>(values.size());
        out.resize(8);
        std::memcpy(out.data(), &n, 8);
        break;
      }
      default:
        result = status_bad_request;
    }
  }
  bytes frame{result};
  put_u32(frame, static_cast<uint32_t>(out.size()));
  frame.insert(frame.end(), out.begin(), out.end());
  // A peer that stops reading is given up on after the handshake's time.
  return write_all(fd, frame.data(), frame.size(), clock_type::now() + handshake_timeout);
}

void store_server::state::serve(int fd) {
  auto who = peer_of(fd);
  if (!handshake(fd)) {
    ++refused;
    spdlog::warn("rendezvous store: refused {}: it did not prove the run's secret", who);
    return;
  }
  ++admitted;
  // Requests until the peer hangs up. A request is small and arrives at once; only
  // waiting for keys takes long, and that is bounded by the request's own timeout.
  while (!stopping) {
    auto deadline = clock_type::now() + std::chrono::hours(24);  // an idle, admitted peer may stay
    uint8_t op = 0;
    uint32_t timeout_ms = 0, count = 0;
    if (!read_exact(fd, &op, 1, deadline))
      return;
    auto body = clock_type::now() + handshake_timeout;
    if (!get_u32(fd, timeout_ms, body) || !get_u32(fd, count, body) || count == 0 || count > max_keys)
      return;
    std::vector<std::string> keys;
    for (uint32_t i = 0; i < count; ++i) {
      bytes key;
      if (!get_blob(fd, key, max_key_bytes, body))
        return;
      keys.emplace_back(key.begin(), key.end());
    }
    bytes value;
    if (!get_blob(fd, value, max_value_bytes, body) || !answer(fd, op, timeout_ms, keys, value))
      return;
  }
}

void store_server::state::accept_loop() {
  while (!stopping) {
    pollfd pfd{listen_fd, POLLIN, 0};
    if (::poll(&pfd, 1, 200) <= 0)
      continue;
    int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0)
      continue;
    std::lock_guard<std::mutex> lock{mutex};
    for (auto w = workers.begin(); w != workers.end();)  // reap the finished ones
      if (*w->done) {
        w->thread.join();
        w = workers.erase(w);
      } else {
        ++w;
      }
    if (stopping || connections.size() >= max_connections) {
      ++refused;
      ::close(fd);
      continue;
    }
    connections.push_back(fd);
    auto where = std::prev(connections.end());
    worker w;
    w.thread = std::thread([this, fd, where, done = w.done] {
      serve(fd);
      std::lock_guard<std::mutex> finished{mutex};
      if (!stopping) {  // when stopping, the destructor closes it after shutting it down
        ::close(fd);
        connections.erase(where);
      }
      *done = true;
    });
    workers.push_back(std::move(w));
  }
}

store_server::store_server(const std::string& host, std::string secret, std::chrono::milliseconds handshake_timeout)
    : state_(std::make_shared<state>()) {
  if (secret.size() < 16)
    throw store_error("rendezvous store: the secret is too short");
  state_->secret = std::move(secret);
  state_->handshake_timeout = handshake_timeout;
  auto* found = resolve(host, 0, true);
  std::string why = "no address";
  for (auto* a = found; a && state_->listen_fd < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
      continue;
    int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      state_->listen_fd = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (state_->listen_fd < 0)
    throw store_error("rendezvous store: cannot listen on " + host + ": " + why);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(state_->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  state_->port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  state_->acceptor = std::thread([s = state_.get()] { s->accept_loop(); });
}

void store_server::abandon(const std::string& prefix) {
  std::lock_guard<std::mutex> lock{state_->mutex};
  state_->abandoned.insert(prefix);
  state_->changed.notify_all();
}

store_server::~store_server() {
  auto& s = *state_;
  {
    std::lock_guard<std::mutex> lock{s.mutex};
    s.stopping = true;
    for (int fd : s.connections)
      ::shutdown(fd, SHUT_RDWR);  // wakes every reader
    s.changed.notify_all();        // and every waiter
  }
  s.acceptor.join();
  for (auto& w : s.workers)
    w.thread.join();
  for (int fd : s.connections)
    ::close(fd);
  ::close(s.listen_fd);
}

uint16_t store_server::port() const {
  return state_->port;
}

uint64_t store_server::refused() const {
  return state_->refused;
}

uint64_t store_server::admitted() const {
  return state_->admitted;
}

// -- client ------------------------------------------------------------------------

store_client::store_client(const std::string& host, uint16_t port, const std::string& secret,
                           std::chrono::milliseconds timeout)
    : timeout_(timeout) {
  auto where = host + ":" + std::to_string(port);
  auto* found = resolve(host, port, false);
  auto deadline = clock_type::now() + timeout;
  std::string why = "no address";
  for (auto* a = found; a && fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
      continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (fd_ < 0)
    throw store_error("rendezvous store at " + where + ": cannot connect: " + why);
  int on = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  bytes hello(greeting_size + nonce_size);
  if (!read_exact(fd_, hello.data(), hello.size(), deadline) ||
      std::memcmp(hello.data(), greeting, greeting_size) != 0) {
    ::close(fd_);
    throw store_error("rendezvous store at " + where + ": no greeting (not an areal rendezvous store?)");
  }
  bytes server_nonce(hello.begin() + greeting_size, hello.end());
  auto client_nonce = random_bytes(nonce_size);
  auto proof = mac(secret, "client", server_nonce);
  bytes answer = client_nonce;
  answer.insert(answer.end(), proof.begin(), proof.end());
  bytes reply(mac_size);
  if (!write_all(fd_, answer.data(), answer.size(), deadline) ||
      !read_exact(fd_, reply.data(), mac_size, deadline)) {
    ::close(fd_);
    throw store_error("rendezvous store at " + where + ": refused this node (a secret from another run?)");
  }
  if (!same(reply, mac(secret, "server", client_nonce))) {
    ::close(fd_);
    throw store_error("rendezvous store at " + where + ": the server does not hold the run's secret");
  }
}

store_client::~store_client() {
  if (fd_ >= 0)
    ::close(fd_);
}

bytes store_client::call(uint8_t op, const std::vector<std::string>& keys, const bytes& value,
                         std::chrono::milliseconds timeout) {
  bytes frame{op};
  put_u32(frame, static_cast<uint32_t>(std::min<int64_t>(timeout.count(), UINT32_MAX)));
  put_u32(frame, static_cast<uint32_t>(keys.size()));
  for (auto& k : keys) {
    put_u32(frame, static_cast<uint32_t>(k.size()));
    frame.insert(frame.end(), k.begin(), k.end());
  }
  put_u32(frame, static_cast<uint32_t>(value.size()));
  frame.insert(frame.end(), value.begin(), value.end());
  // The server answers a wait by its deadline; a little more covers the round trip.
  auto deadline = clock_type::now() + timeout + std::chrono::seconds(5);
  if (!write_all(fd_, frame.data(), frame.size(), deadline))
    throw store_error("rendezvous store: the connection is lost (or the store stopped reading)");
  uint8_t result = 0;
  bytes out;
  if (!read_exact(fd_, &result, 1, deadline) || !get_blob(fd_, out, max_value_bytes, deadline))
    throw store_error("rendezvous store: no answer (the connection is lost or the server is stuck)");
  auto waited_for = keys.empty() ? std::string{"keys"} : "\"" + keys[0] + "\"";
  if (result == status_abandoned)
    throw store_error("rendezvous store: the wait for " + waited_for +
                      " was abandoned (the peer it waited for is gone)");
  if (result == status_timeout)
    throw store_error("rendezvous store: timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                      waited_for);
  if (result != status_ok)
    throw store_error("rendezvous store: the server refused the request");
  return out;
}

void store_client::set(const std::string& key, const bytes& value) {
  call(op_set, {key}, value, timeout_);
}

bytes store_client::get(const std::string& key, std::chrono::milliseconds timeout) {
  return call(op_get, {key}, {}, timeout);
}

int64_t store_client::add(const std::string& key, int64_t delta) {
  bytes value(8);
  std::memcpy(value.data(), &delta, 8);
  auto out = call(op_add, {key}, value, timeout_);
  int64_t now = 0;
  std::memcpy(&now, out.data(), std::min<size_t>(8, out.size()));
  return now;
}

bool store_client::erase(const std::string& key) {
  auto out = call(op_erase, {key}, {}, timeout_);
  return !out.empty() && out[0] == 1;
}

bool store_client::check(const std::vector<std::string>& keys) {
  auto out = call(op_check, keys, {}, timeout_);
  return !out.empty() && out[0] == 1;
}

void store_client::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  call(op_wait, keys, {}, timeout);
}

int64_t store_client::size() {
  auto out = call(op_size, {"-"}, {}, timeout_);
  int64_t n = 0;
  std::memcpy(&n, out.data(), std::min<size_t>(8, out.size()));
  return n;
}

}  // namespace areal
