// The weight subscriber (weight_transport.hpp): receives every announced
// version over its bulk link or as CAF chunks, checks every chunk, fetches a
// damaged one again, skips to the newest version and hands it to the node's
// rollout workers.
#include "areal/actors/exception_guard.hpp"
#include "areal/actors/weight_transport.hpp"

#include <ATen/ATen.h>

#include <deque>
#include <map>
#include <set>
#include <sstream>

#include <caf/all.hpp>

#include "areal/runtime/failpoints.hpp"
#include "areal/runtime/log.hpp"
#include "gloo_link.hpp"
#include "nccl_link.hpp"

namespace areal {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// -- subscriber ---------------------------------------------------------------

struct subscriber_state {
  static inline const char* name = "areal.weight_subscriber";
  weight_subscriber_setup setup;
  weight_publisher_actor publisher;
  std::optional<weight_manifest> announced;  // the newest announced version
  int64_t applied = -1;                      // the newest version handed to the sinks
  std::shared_ptr<const at::Tensor> last;    // its buffer (reused once the sinks let go of it)
  std::unique_ptr<bulk_link> link;
  bool fetching = false;  // a CAF fetch is in progress
};

using subscriber_pointer = weight_subscriber_actor::stateful_pointer<subscriber_state>;

// One version in progress over CAF: chunks requested a window at a time.
struct caf_transfer {
  weight_manifest manifest;
  at::Tensor buffer;
  clock_type::time_point started;
  uint64_t next = 0;      // next chunk to request
  uint64_t received = 0;  // chunks verified
  uint32_t resent = 0;
  std::set<uint64_t> retried;
  std::string backend = "caf";
  bool failed = false;
};

void fetch_newest(subscriber_pointer self);

void report(subscriber_pointer self, const weight_manifest& m, const std::string& backend, double seconds,
            uint32_t resent, const std::string& error) {
  auto& st = self->state;
  weight_delivery d{st.setup.node, m.version, backend, m.total_bytes, seconds, resent, error};
  self->send(st.publisher, d);
  if (!error.empty())
    spdlog::warn("weights: version {} not received: {}", m.version, error);
  if (st.setup.listener)
    caf::anon_send(st.setup.listener, weights_atom::value, m.version, error);
}

void deliver(subscriber_pointer self, const weight_manifest& m, at::Tensor buffer, const std::string& backend,
             double seconds, uint32_t resent) {
  auto& st = self->state;
  local_weights w{m.version, std::make_shared<const at::Tensor>(buffer.view(at::kFloat))};
  st.last = w.flat;
  for (auto& sink : st.setup.sinks)
    caf::anon_send(sink, w);
  st.applied = m.version;
  spdlog::debug("weights: version {} received over {} ({} bytes in {:.3f} s, {} chunk(s) fetched again)", m.version,
                backend, m.total_bytes, seconds, resent);
  report(self, m, backend, seconds, resent, {});
}

bool chunk_ok(const weight_manifest& m, uint64_t i, const char* data, size_t size, uint64_t sum) {
  return size == chunk_range(m, i).second && chunk_checksum(data, size) == sum;
}

void request_chunks(subscriber_pointer self, std::shared_ptr<caf_transfer> t);

void fetch_chunk(subscriber_pointer self, std::shared_ptr<caf_transfer> t, uint64_t i) {
  auto& st = self->state;
  self->request(st.publisher, st.setup.timeout, fetch_atom::value, t->manifest.version, i)
      .then(
          [self, t, i](uint64_t sum, std::string& bytes) {
            if (t->failed)
              return;
            if (!chunk_ok(t->manifest, i, bytes.data(), bytes.size(), sum)) {
              if (t->retried.insert(i).second) {
                t->resent++;
                spdlog::warn("weights: chunk {} of version {} failed its checksum; fetching it again", i,
                             t->manifest.version);
                fetch_chunk(self, t, i);
                return;
              }
              t->failed = true;
              self->state.fetching = false;
              report(self, t->manifest, t->backend, seconds_since(t->started), t->resent,
                     "chunk " + std::to_string(i) + " failed its checksum twice");
              fetch_newest(self);
              return;
            }
            auto [first, size] = chunk_range(t->manifest, i);
            auto chunk = at::from_blob(bytes.data(), {static_cast<int64_t>(size)}, at::kByte);
            t->buffer.narrow(0, static_cast<int64_t>(first), static_cast<int64_t>(size)).copy_(chunk);
            t->received++;
            request_chunks(self, t);
          },
          [self, t, i](caf::error& err) {
            if (t->failed)
              return;
            t->failed = true;
            self->state.fetching = false;
            report(self, t->manifest, t->backend, seconds_since(t->started), t->resent,
                   "fetching chunk " + std::to_string(i) + ": " + describe(err));
            fetch_newest(self);
          });
}

// Keeps a window of chunk requests in flight; delivers when every chunk is in.
void request_chunks(subscriber_pointer self, std::shared_ptr<caf_transfer> t) {
  constexpr uint64_t window = 4;
  auto count = t->manifest.chunk_count();
  if (t->received == count) {
    self->state.fetching = false;
    deliver(self, t->manifest, t->buffer, t->backend, seconds_since(t->started), t->resent);
    fetch_newest(self);
    return;
  }
  while (t->next < count && t->next - t->received < window)
    fetch_chunk(self, t, t->next++);
}

// Receives a version over the bulk link (blocking this actor's thread);
// damaged chunks are listed in `bad`. False when the link failed or the
// version was replaced meanwhile.
bool receive_over_link(subscriber_pointer self, const weight_manifest& m, at::Tensor& buffer,
                       std::vector<uint64_t>& bad) {
  auto& st = self->state;
  self->request(st.publisher, st.setup.timeout, push_atom::value, st.setup.node, m.version)
      .then([](bool) {}, [](caf::error& err) { spdlog::debug("weights: push request failed: {}", describe(err)); });
  try {
    auto bytes = buffer.view(at::kByte);
    return st.link->receive_version(m, bytes, bad);
  } catch (const std::exception& e) {
    spdlog::warn("weights: {}; fetching over CAF from now on", e.what());
    st.link.reset();
    return false;
  }
}

// Where a version is received: the configured GPU when the link reads GPU memory (NCCL), else host
// memory (the Gloo link's and the CAF chunks' bytes are there).
at::Device receive_device(const subscriber_state& st) {
  bool gpu = at::Device(st.setup.device).is_cuda() && st.link && st.link->reads_device_memory();
  return gpu ? at::Device(at::kCUDA, static_cast<at::DeviceIndex>(gpu_of(st.setup.device))) : at::Device(at::kCPU);
}

void start_version(subscriber_pointer self, const weight_manifest& m) {
  auto& st = self->state;
  if (st.setup.expected_bytes != 0 && m.total_bytes != st.setup.expected_bytes) {
    report(self, m, "none", 0, 0,
           "the published weights have " + std::to_string(m.total_bytes) + " bytes, this node's model " +
               std::to_string(st.setup.expected_bytes) + ": configure the same model on every node");
    return;
  }
  auto t = std::make_shared<caf_transfer>();
  t->manifest = m;
  t->started = clock_type::now();
  // The previous version's buffer is reused when nobody holds it any more
  // (fresh pages cost a page fault each as the bytes arrive).
  auto where = receive_device(st);
  if (st.last && st.last.use_count() == 1 && static_cast<uint64_t>(st.last->nbytes()) == m.total_bytes &&
      st.last->device() == where)
    t->buffer = st.last->view(at::kByte);
  else
    t->buffer = at::empty({static_cast<int64_t>(m.total_bytes)}, at::TensorOptions(at::kByte).device(where));
  st.last.reset();
  if (st.link) {
    std::vector<uint64_t> bad;
    std::string backend = st.link->backend();
    if (receive_over_link(self, m, t->buffer, bad)) {
      if (bad.empty()) {
        deliver(self, m, t->buffer, backend, seconds_since(t->started), 0);
        return;
      }
      // Damaged chunks are fetched again over CAF; the rest stays.
      t->backend = backend;
      t->next = m.chunk_count();
      t->received = m.chunk_count() - bad.size();
      st.fetching = true;
      for (auto i : bad) {
        spdlog::warn("weights: chunk {} of version {} failed its checksum; fetching it again", i, m.version);
        t->resent++;
        t->retried.insert(i);
        fetch_chunk(self, t, i);
      }
      return;
    }
    if (!st.link) {
      t->backend = "caf (after a " + backend + " failure)";
    } else {
      // The version was replaced before it could be sent: take the newest.
      self->send(self, fetch_atom::value);
      return;
    }
  }
  st.fetching = true;
  request_chunks(self, t);
}

void fetch_newest(subscriber_pointer self) {
  auto& st = self->state;
  if (st.fetching || !st.announced || st.announced->version <= st.applied)
    return;
  auto m = *st.announced;
  start_version(self, m);
}

weight_subscriber_actor::behavior_type subscriber_behavior(subscriber_pointer self, weight_subscriber_setup setup) {
  guard_exceptions(self, "weight subscriber");
  auto& st = self->state;
  st.setup = std::move(setup);
  st.publisher = caf::actor_cast<weight_publisher_actor>(st.setup.publisher);
  self->monitor(st.setup.publisher);
  self->set_down_handler([self](caf::down_msg& down) {
    // The node notices the controller node's loss by itself; this is not an error of the subscriber.
    spdlog::info("weights: the publisher is gone ({}); no more updates", describe(down.reason));
    self->quit(caf::exit_reason::normal);
  });
  self->request(st.publisher, st.setup.timeout, subscribe_atom::value, st.setup.node, caf::actor_cast<caf::actor>(self),
                accepted_links(st.setup.allow_bulk))
      .then(
          [self](packed<weight_manifest>& newest, std::string& link) {
            auto& s = self->state;
            std::istringstream words(link);
            std::string kind, endpoint, prefix, secret;
            words >> kind >> endpoint >> prefix >> secret;
            try {
              if (kind == "gloo" && s.setup.allow_bulk) {
                auto colon = endpoint.rfind(':');
                s.link = std::make_unique<gloo_link>(endpoint.substr(0, colon),
                                                     static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))),
                                                     secret, prefix, s.setup.device_host, s.setup.timeout);
              } else if (kind == "nccl" && s.setup.allow_bulk) {
                s.link = make_nccl_link(endpoint, 1, gpu_of(s.setup.device), s.setup.timeout);
              }
            } catch (const std::exception& e) {
              spdlog::warn("weights: {}; fetching over CAF", e.what());
            }
            spdlog::info("weights: subscribed ({})",
                         s.link ? std::string{s.link->backend()} + " link" : std::string{"CAF messages"});
            if (auto m = unpack(newest); m && m->version >= 0) {
              s.announced = *m;
              self->send(self, fetch_atom::value);
            }
          },
          [self](caf::error& err) {
            spdlog::error("weights: cannot subscribe to the publisher: {}", describe(err));
            self->quit(err);
          });
  return {
      [self](packed<weight_manifest>& msg) {
        auto m = unpack(msg);
        if (!m) {
          spdlog::warn("weights: unreadable manifest: {}", describe(m.error()));
          return;
        }
        auto& s = self->state;
        if (!s.announced || m->version > s.announced->version)
          s.announced = std::move(*m);
        if (failpoints::fire("weights.slow_fetch"))
          self->delayed_send(self, std::chrono::seconds(1), fetch_atom::value);
        else
          self->send(self, fetch_atom::value);
      },
      [self](fetch_atom) { fetch_newest(self); },
  };
}

}  // namespace

weight_subscriber_actor spawn_weight_subscriber(caf::actor_system& sys, weight_subscriber_setup setup) {
  return sys.spawn(subscriber_behavior, std::move(setup));
}

}  // namespace areal
