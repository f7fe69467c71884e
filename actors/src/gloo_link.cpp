// The Gloo link (gloo_link.hpp): the one translation unit with c10d headers.
#include "gloo_link.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "areal/messages/codec.hpp"
#include "areal/runtime/failpoints.hpp"
#include "rendezvous_store.hpp"

namespace areal {

namespace {

// c10d's view of one authenticated connection to the rendezvous store: what
// ProcessGroupGloo needs to exchange its addresses (set, get, wait), and the rest.
class authenticated_store final : public c10d::Store {
 public:
  authenticated_store(const std::string& host, uint16_t port, const std::string& secret,
                      std::chrono::milliseconds timeout)
      : c10d::Store(timeout), host_(host), port_(port), secret_(secret), client_(host, port, secret, timeout) {}
  // LibTorch 2.x stores must clone themselves (a pure virtual there, absent in
  // 1.13): declared without `override` so that it compiles against both.
  c10::intrusive_ptr<c10d::Store> clone() {
    return c10::make_intrusive<authenticated_store>(host_, port_, secret_, timeout_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override { client_.set(key, value); }
  std::vector<uint8_t> get(const std::string& key) override { return client_.get(key, timeout_); }
  int64_t add(const std::string& key, int64_t value) override { return client_.add(key, value); }
  bool deleteKey(const std::string& key) override { return client_.erase(key); }
  bool check(const std::vector<std::string>& keys) override { return client_.check(keys); }
  int64_t getNumKeys() override { return client_.size(); }
  void wait(const std::vector<std::string>& keys) override { client_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    client_.wait(keys, timeout);
  }

 private:
  std::string host_;
  uint16_t port_;
  std::string secret_;
  store_client client_;
};

}  // namespace

struct gloo_rendezvous::impl {
  std::unique_ptr<store_server> server;
  std::string secret;
};

struct gloo_link::impl {
  std::chrono::milliseconds timeout;
  std::unique_ptr<c10d::ProcessGroupGloo> group;
  std::vector<c10::intrusive_ptr<c10d::Work>> posted;
};

namespace {

std::unique_ptr<c10d::ProcessGroupGloo> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                   const std::string& prefix, int rank, const std::string& device_host,
                                                   std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(device_host));
  options->threads = 1;
  auto scoped = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  return std::make_unique<c10d::ProcessGroupGloo>(scoped, rank, 2, options);
}

template <class F>
auto rethrow_as_runtime_error(const char* what, F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string{what} + ": " + e.what());
  }
}

}  // namespace

bool gloo_available() {
  return true;
}

const char* gloo_absent_reason() {
  return "";
}

gloo_rendezvous::gloo_rendezvous(const std::string& host, std::chrono::milliseconds timeout)
    : host_(host), impl_(std::make_unique<impl>()) {
  rethrow_as_runtime_error("cannot start the Gloo rendezvous", [&] {
    impl_->secret = make_store_secret();
    // A peer gets at most this long to prove the secret before it is turned away.
    impl_->server =
        std::make_unique<store_server>(host, impl_->secret, std::min(timeout, std::chrono::milliseconds(5000)));
    return 0;
  });
}

gloo_rendezvous::~gloo_rendezvous() = default;

uint16_t gloo_rendezvous::port() const {
  return impl_->server->port();
}

const std::string& gloo_rendezvous::secret() const {
  return impl_->secret;
}

uint64_t gloo_rendezvous::refused() const {
  return impl_->server->refused();
}

void gloo_rendezvous::abandon(const std::string& prefix) {
  impl_->server->abandon(prefix.empty() ? prefix : prefix + "/");  // c10d's PrefixStore: PREFIX/KEY
}

gloo_link::gloo_link(gloo_rendezvous& rendezvous, const std::string& prefix, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
  impl_->timeout = timeout;
  impl_->group = rethrow_as_runtime_error("cannot open the Gloo link (sending side)", [&] {
    auto store =
        c10::make_intrusive<authenticated_store>(rendezvous.host(), rendezvous.port(), rendezvous.secret(), timeout);
    return make_group(store, prefix, 0, rendezvous.host(), timeout);
  });
}

gloo_link::gloo_link(const std::string& host, uint16_t port, const std::string& secret, const std::string& prefix,
                     const std::string& device_host, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
  impl_->timeout = timeout;
  impl_->group = rethrow_as_runtime_error("cannot open the Gloo link (receiving side)", [&] {
    auto store = c10::make_intrusive<authenticated_store>(host, port, secret, timeout);
    return make_group(store, prefix, 1, device_host, timeout);
  });
}

gloo_link::~gloo_link() = default;

void gloo_link::send(const at::Tensor& bytes, int tag) {
  rethrow_as_runtime_error("Gloo send failed", [&] {
    std::vector<at::Tensor> tensors{bytes};
    impl_->group->send(tensors, 1, tag)->wait(impl_->timeout);
    return 0;
  });
}

void gloo_link::recv(at::Tensor& bytes, int tag) {
  rethrow_as_runtime_error("Gloo receive failed", [&] {
    std::vector<at::Tensor> tensors{bytes};
    impl_->group->recv(tensors, 0, tag)->wait(impl_->timeout);
    return 0;
  });
}

size_t gloo_link::post_send(const at::Tensor& bytes, int tag) {
  return rethrow_as_runtime_error("Gloo send failed", [&] {
    std::vector<at::Tensor> tensors{bytes};
    impl_->posted.push_back(impl_->group->send(tensors, 1, tag));
    return impl_->posted.size() - 1;
  });
}

size_t gloo_link::post_recv(at::Tensor& bytes, int tag) {
  return rethrow_as_runtime_error("Gloo receive failed", [&] {
    std::vector<at::Tensor> tensors{bytes};
    impl_->posted.push_back(impl_->group->recv(tensors, 0, tag));
    return impl_->posted.size() - 1;
  });
}

void gloo_link::wait(size_t index) {
  rethrow_as_runtime_error("Gloo transfer failed", [&] {
    impl_->posted.at(index)->wait(impl_->timeout);
    return 0;
  });
}

void gloo_link::clear_posted() {
  impl_->posted.clear();
}

void gloo_link::send_version(const weight_manifest& m, const at::Tensor* bytes, chunk_sums* sums,
                             const chunk_tamper& tamper) {
  auto header = at::full({1}, bytes ? m.version : -1, at::kLong);
  send(header, 0);
  if (!bytes)
    return;
  auto count = m.chunk_count();
  auto sent_sums = at::empty({static_cast<int64_t>(count)}, at::kLong);
  auto* sum = sent_sums.data_ptr<int64_t>();
  std::vector<at::Tensor> altered;  // kept alive until sent
  for (uint64_t i = 0; i < count; ++i) {
    auto [first, size] = chunk_range(m, i);
    auto chunk = bytes->narrow(0, static_cast<int64_t>(first), static_cast<int64_t>(size));
    sum[i] = static_cast<int64_t>(sums->get(i, chunk.data_ptr(), size));
    if (tamper) {
      std::string copy(static_cast<const char*>(chunk.data_ptr()), size);
      tamper(m.version, i, copy);
      altered.push_back(at::empty({static_cast<int64_t>(size)}, at::kByte));
      std::memcpy(altered.back().data_ptr(), copy.data(), size);
      chunk = altered.back();
    }
    if (i == count / 2 && failpoints::fire("weights.transfer_cut"))
      throw std::runtime_error("version " + std::to_string(m.version) + " cut after " + std::to_string(i) + " of " +
                               std::to_string(count) + " chunk(s) (failpoint weights.transfer_cut)");
    post_send(chunk, static_cast<int>(2 * i + 1));
    post_send(sent_sums.narrow(0, static_cast<int64_t>(i), 1), static_cast<int>(2 * i + 2));
  }
  for (size_t k = 0; k < 2 * count; ++k)
    wait(k);
  clear_posted();
}

bool gloo_link::receive_version(const weight_manifest& m, at::Tensor& buffer, std::vector<uint64_t>& bad) {
  auto header = at::empty({1}, at::kLong);
  recv(header, 0);
  if (header.item<int64_t>() != m.version)
    return false;
  // Every receive is posted at once; each chunk is checked while the later ones arrive.
  auto count = m.chunk_count();
  auto sums = at::empty({static_cast<int64_t>(count)}, at::kLong);
  std::vector<at::Tensor> chunks, chunk_sums;
  for (uint64_t i = 0; i < count; ++i) {
    auto [first, size] = chunk_range(m, i);
    chunks.push_back(buffer.narrow(0, static_cast<int64_t>(first), static_cast<int64_t>(size)));
    chunk_sums.push_back(sums.narrow(0, static_cast<int64_t>(i), 1));
    post_recv(chunks.back(), static_cast<int>(2 * i + 1));
    post_recv(chunk_sums.back(), static_cast<int>(2 * i + 2));
  }
  for (uint64_t i = 0; i < count; ++i) {
    wait(2 * i);
    wait(2 * i + 1);
    auto size = chunk_range(m, i).second;
    if (chunk_checksum(chunks[i].data_ptr(), size) != static_cast<uint64_t>(sums.data_ptr<int64_t>()[i]))
      bad.push_back(i);
  }
  clear_posted();
  return true;
}

}  // namespace areal
