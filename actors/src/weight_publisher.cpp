// The weight publisher (weight_transport.hpp): holds the newest versions,
// announces each to every subscriber, sends it over their bulk links and
// collects their reports. What link each subscriber gets: weight_backends.cpp.
#include "areal/actors/exception_guard.hpp"
#include "areal/actors/weight_transport.hpp"

#include <ATen/ATen.h>

#include <deque>
#include <map>
#include <mutex>
#include <set>

#include <caf/all.hpp>

#include "areal/kernels/device.hpp"
#include "areal/runtime/log.hpp"
#include "gloo_link.hpp"
#include "nccl_link.hpp"

namespace areal {

const char* to_string(weight_errc x) {
  switch (x) {
    case weight_errc::gone:
      return "gone";
    case weight_errc::corrupted:
      return "corrupted";
    case weight_errc::size_mismatch:
      return "size_mismatch";
  }
  return "unknown";
}

namespace {

const char* bytes_of(const at::Tensor& t) {
  return static_cast<const char*>(t.data_ptr());
}

}  // namespace

local_weights publishable_copy(int64_t version, const at::Tensor& flat, const std::string& device) {
  at::Device where(device);
  auto copy = flat.detach().to(flat.options().device(where), false, true);
  if (where.is_cuda())
    kernels::synchronize(where);  // the links send from NCCL's own stream
  return {version, std::make_shared<const at::Tensor>(std::move(copy))};
}

namespace {

// -- publisher ----------------------------------------------------------------

// A held version as the links read it: its bytes where the trainer published them (on its GPU for
// NCCL links, else in host memory), a host copy made once when the first link or fetch that needs one
// asks (a version on a GPU that only NCCL links send is never copied), and the sender's checksums,
// shared by every link and the CAF path.
class version_bytes {
 public:
  version_bytes(at::Tensor published, uint64_t chunks) : published_(std::move(published)), sums_(chunks) {}
  const at::Tensor& in_host_memory() {
    if (published_.is_cpu())
      return published_;
    std::call_once(copied_, [this] { host_ = published_.cpu(); });
    return host_;
  }
  /// What a link sends: the bytes as published where it reads GPU memory, else the host copy.
  const at::Tensor& for_link(const bulk_link& link, bool tampered) {
    return link.reads_device_memory() && !tampered ? published_ : in_host_memory();
  }
  chunk_sums& sums() { return sums_; }

 private:
  at::Tensor published_;  // uint8, one dimension
  std::once_flag copied_;
  at::Tensor host_;
  chunk_sums sums_;
};

struct held_version {
  local_weights weights;
  weight_manifest manifest;
  packed<weight_manifest> packed_manifest;
  std::shared_ptr<version_bytes> bytes;
};

// The versions held, by version, for the bulk senders (each on a thread of its own).
struct held_bytes {
  std::mutex mutex;
  std::map<int64_t, std::shared_ptr<version_bytes>> by_version;

  std::shared_ptr<version_bytes> find(int64_t version) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = by_version.find(version);
    return it == by_version.end() ? nullptr : it->second;
  }
};

struct subscriber_entry {
  caf::actor handle;
  bool local = false;
  bulk_sender_actor bulk_sender;  // the sending side of its bulk link (Gloo, NCCL), when it has one
  std::string gloo_prefix;        // its Gloo link's keys at the rendezvous, when it has one
};

struct pending_publish {
  caf::typed_response_promise<std::vector<weight_delivery>> promise;
  std::set<std::string> waiting;
  std::vector<weight_delivery> reports;
};

struct publisher_state {
  static inline const char* name = "areal.weight_publisher";
  weight_publisher_setup setup;
  std::deque<held_version> held;                                    // the newest two versions, oldest first
  std::shared_ptr<held_bytes> bytes = std::make_shared<held_bytes>();  // their bytes and checksums, for the links
  std::map<std::string, subscriber_entry> subscribers;
  std::map<int64_t, pending_publish> pending;  // by version
  caf::actor watcher;  // told each subscriber's report as it comes (the controller: admission per node)
  std::shared_ptr<gloo_rendezvous> rendezvous;
  bool bulk_failed = false;  // the bulk backend cannot start here: CAF messages for everyone
  uint64_t links = 0;
};

using publisher_pointer = weight_publisher_actor::stateful_pointer<publisher_state>;

const held_version* find_version(publisher_state& st, int64_t version) {
  for (auto& h : st.held)
    if (h.weights.version == version)
      return &h;
  return nullptr;
}

// The announcement of a version: its size and chunking. The checksums are
// computed as the chunks are sent, so publishing costs no pass over the buffer.
weight_manifest make_manifest(const weight_publisher_setup& setup, const local_weights& w) {
  weight_manifest m;
  m.version = w.version;
  m.tensors = setup.tensors;
  m.total_bytes = static_cast<uint64_t>(w.flat->nbytes());
  m.chunk_bytes = setup.chunk_bytes;
  return m;
}

void settle(publisher_pointer self, int64_t version, bool deadline) {
  auto& st = self->state;
  auto it = st.pending.find(version);
  if (it == st.pending.end())
    return;
  if (!it->second.waiting.empty() && !deadline)
    return;
  for (auto& name : it->second.waiting) {
    weight_delivery d;
    d.subscriber = name;
    d.version = version;
    d.error = "no report within the transfer deadline of " + std::to_string(st.setup.timeout.count()) + " ms";
    it->second.reports.push_back(d);
  }
  it->second.promise.deliver(std::move(it->second.reports));
  st.pending.erase(it);
}

// A report (or a loss) of `name` settles every pending version up to `version`;
// it also goes to the watcher at once (a settled version waits for the slowest
// subscriber; each node's own report lets work go there before).
void record(publisher_pointer self, const weight_delivery& report) {
  auto& st = self->state;
  if (st.watcher)
    caf::anon_send(st.watcher, report);
  std::vector<int64_t> versions;
  for (auto& [v, p] : st.pending)
    if (v <= report.version && p.waiting.erase(report.subscriber)) {
      auto r = report;
      if (v != report.version && r.error.empty())
        r.backend += " (caught up to version " + std::to_string(report.version) + ")";
      p.reports.push_back(r);
      versions.push_back(v);
    }
  for (auto v : versions)
    settle(self, v, false);
}

// The sending side of one subscriber's bulk link, on a thread of its own:
// opening the link and sending block until the receiver takes part (or the
// deadline passes).
bulk_sender_actor::behavior_type bulk_sender(bulk_sender_actor::pointer self,
                                             std::function<std::shared_ptr<bulk_link>()> open, chunk_tamper tamper,
                                             std::shared_ptr<held_bytes> held) {
  std::shared_ptr<bulk_link> link;
  try {
    link = open();
  } catch (const std::exception& e) {
    spdlog::warn("weight publisher: {}; that subscriber fetches over CAF", e.what());
    self->quit(caf::exit_reason::normal);  // normal: the linked publisher lives on
  }
  return {
      [self, link, tamper, held](push_atom, local_weights& w,
                                 packed<weight_manifest>& packed_manifest) -> caf::result<bool> {
        if (!link)
          return caf::make_error(caf::sec::runtime_error, "weight publisher: the bulk link did not open");
        try {
          auto version = w.flat ? held->find(w.version) : nullptr;
          if (!version) {  // no longer held
            weight_manifest none;
            link->send_version(none, nullptr, nullptr, tamper);
            return false;
          }
          auto& bytes = version->for_link(*link, static_cast<bool>(tamper));
          link->send_version(*unpack(packed_manifest), &bytes, &version->sums(), tamper);
          return true;
        } catch (const std::exception& e) {
          spdlog::warn("weight publisher: {}", e.what());
          self->quit(caf::exit_reason::normal);
          return caf::make_error(caf::sec::runtime_error, e.what());
        }
      },
  };
}

// The sending side of a new subscriber's bulk link of `kind` (Gloo or NCCL, offered_link's for what it
// `accepted`), and what the subscriber is told to open (`link`, and the Gloo rendezvous' `secret`).
// NCCL gives way as offered_link says where its communicator cannot be made here after all; where
// Gloo's rendezvous cannot start, every subscriber gets CAF messages (`bulk_failed`). No sender (and
// `link` left "caf") where the subscriber gets CAF messages.
void open_bulk_sender(publisher_pointer self, const std::string& name, const std::string& accepted, weight_backend kind,
                      subscriber_entry& entry, std::string& link, std::string& secret) {
  auto& st = self->state;
  try {
    std::function<std::shared_ptr<bulk_link>()> open;
    if (kind == weight_backend::nccl) {
      try {
        auto id = nccl_unique_id();
        open = [id, gpu = gpu_of(st.setup.device), timeout = st.setup.timeout] {
          return make_nccl_link(id, 0, gpu, timeout);
        };
        link = "nccl " + id;
      } catch (const std::exception& e) {
        // The weights are in host memory where NCCL cannot run: Gloo is the fast path for them.
        std::string why;
        kind = offered_link(weight_backend::nccl, accepted, false, gloo_available(), why);
        spdlog::warn("weight publisher: subscriber {}: {}: {}", name, e.what(), why);
        if (kind == weight_backend::caf)
          return;
      }
    }
    if (kind == weight_backend::gloo) {
      if (!st.rendezvous) {
        st.rendezvous = std::make_shared<gloo_rendezvous>(st.setup.host, st.setup.timeout);
        // A sender still waiting for its receiver when the publisher ends stops waiting (it would hold
        // the node's shutdown until its deadline).
        self->attach_functor([rendezvous = std::weak_ptr<gloo_rendezvous>(st.rendezvous)] {
          if (auto r = rendezvous.lock())
            r->abandon("");
        });
      }
      auto prefix = "areal/" + name + "/" + std::to_string(++st.links);
      entry.gloo_prefix = prefix;
      open = [rendezvous = st.rendezvous, prefix, timeout = st.setup.timeout] {
        return std::make_shared<gloo_link>(*rendezvous, prefix, timeout);
      };
      link = "gloo " + st.setup.host + ":" + std::to_string(st.rendezvous->port()) + " " + prefix;
      secret = st.rendezvous->secret();
    }
    // Linked: it ends with the publisher (it ends itself normally on a link failure).
    entry.bulk_sender = self->spawn<caf::detached + caf::linked>(bulk_sender, open, st.setup.tamper, st.bytes);
  } catch (const std::exception& e) {
    st.bulk_failed = true;
    link = "caf";
    secret.clear();
    spdlog::warn("weight publisher: {}; weights travel as CAF messages", e.what());
  }
}

// A subscriber gone (or replaced by a new incarnation): its sender ends, and stops waiting at the
// rendezvous for a receiver that will not come (a detached thread blocked there would not see the exit).
void end_bulk_sender(publisher_pointer self, const subscriber_entry& entry) {
  if (!entry.bulk_sender)
    return;
  self->send_exit(entry.bulk_sender, caf::exit_reason::user_shutdown);
  if (!entry.gloo_prefix.empty() && self->state.rendezvous)
    self->state.rendezvous->abandon(entry.gloo_prefix);
}

// A new version: announced to every subscriber; the promise is kept until they all report.
caf::result<std::vector<weight_delivery>> publish(publisher_pointer self, local_weights& w) {
  auto& st = self->state;
  if (!w.flat || !w.flat->is_contiguous())
    return caf::make_error(caf::sec::invalid_argument, "publish: weights must be one contiguous buffer");
  held_version h;
  h.weights = w;
  h.manifest = make_manifest(st.setup, w);
  auto packed_manifest = pack(h.manifest);
  if (!packed_manifest)
    return packed_manifest.error();
  h.packed_manifest = std::move(*packed_manifest);
  h.bytes = std::make_shared<version_bytes>(w.flat->view(-1).view(at::kByte), h.manifest.chunk_count());
  st.held.push_back(h);
  while (st.held.size() > 2)
    st.held.pop_front();
  {
    std::lock_guard<std::mutex> lock(st.bytes->mutex);
    st.bytes->by_version.clear();
    for (auto& kept : st.held)
      st.bytes->by_version[kept.weights.version] = kept.bytes;
  }
  auto promise = self->make_response_promise<std::vector<weight_delivery>>();
  auto& p = st.pending[w.version];
  p.promise = promise;
  for (auto& [name, sub] : st.subscribers) {
    if (sub.local) {
      caf::anon_send(sub.handle, w);
      p.reports.push_back({name, w.version, "in-process", 0, 0.0, 0, {}});
    } else {
      self->send(caf::actor_cast<weight_subscriber_actor>(sub.handle), h.packed_manifest);
      p.waiting.insert(name);
    }
  }
  self->delayed_send(self, st.setup.timeout, publish_atom::value, w.version);
  settle(self, w.version, false);
  return promise;
}

weight_publisher_actor::behavior_type publisher_behavior(publisher_pointer self, weight_publisher_setup setup) {
  guard_exceptions(self, "weight publisher");
  self->state.setup = std::move(setup);
  self->set_down_handler([self](caf::down_msg& down) {
    auto& st = self->state;
    for (auto it = st.subscribers.begin(); it != st.subscribers.end(); ++it) {
      if (it->second.handle.address() != down.source)
        continue;
      auto name = it->first;
      end_bulk_sender(self, it->second);
      st.subscribers.erase(it);
      spdlog::info("weight publisher: subscriber {} left ({})", name, describe(down.reason));
      weight_delivery lost;
      lost.subscriber = name;
      lost.version = INT64_MAX;
      lost.error = "subscriber lost: " + describe(down.reason);
      record(self, lost);
      return;
    }
  });
  return {
      [self](publish_atom, local_weights& w) { return publish(self, w); },
      [self](publish_atom, local_weights& w, caf::actor& watcher) {
        self->state.watcher = watcher;
        return publish(self, w);
      },
      [self](publish_atom, int64_t version) { settle(self, version, true); },
      [self](subscribe_atom, std::string& name, caf::actor& handle,
             std::string& accepted) -> caf::result<packed<weight_manifest>, std::string> {
        auto& st = self->state;
        if (!handle)
          return caf::make_error(caf::sec::invalid_argument, "subscribe: no actor");
        if (auto old = st.subscribers.find(name); old != st.subscribers.end()) {
          // A restarted node under the same name: its old incarnation is gone.
          self->demonitor(old->second.handle);
          end_bulk_sender(self, old->second);
          st.subscribers.erase(old);
        }
        subscriber_entry entry;
        entry.handle = handle;
        entry.local = handle.node() == self->node();
        self->monitor(handle);
        std::string link = entry.local ? "in-process" : "caf";
        std::string secret;  // appended to what the subscriber gets, never logged
        if (!entry.local) {
          std::string why;
          auto kind = offered_link(st.bulk_failed ? weight_backend::caf : st.setup.backend, accepted, nccl_available(),
                                   gloo_available(), why);
          if (!why.empty())
            spdlog::warn("weight publisher: subscriber {}: {}", name, why);
          if (kind != weight_backend::caf)
            open_bulk_sender(self, name, accepted, kind, entry, link, secret);
        }
        st.subscribers[name] = entry;
        spdlog::info("weight publisher: subscriber {} joined ({})", name, link);
        packed<weight_manifest> newest;
        if (!st.held.empty()) {
          if (entry.local)
            caf::anon_send(handle, st.held.back().weights);
          newest = st.held.back().packed_manifest;
        } else {
          weight_manifest none;
          none.version = -1;
          newest = *pack(none);
        }
        return caf::make_result(std::move(newest), secret.empty() ? link : link + " " + secret);
      },
      [self](fetch_atom, int64_t version, uint64_t chunk) -> caf::result<uint64_t, std::string> {
        auto& st = self->state;
        auto* h = find_version(st, version);
        if (!h)
          return caf::make_error(weight_errc::gone,
                                 "version " + std::to_string(version) + " is no longer held; fetch the newest version");
        if (chunk >= h->manifest.chunk_count())
          return caf::make_error(caf::sec::invalid_argument, "no chunk " + std::to_string(chunk));
        auto [first, size] = chunk_range(h->manifest, chunk);
        auto* data = bytes_of(h->bytes->in_host_memory()) + first;
        auto sum = h->bytes->sums().get(chunk, data, size);
        std::string bytes(data, size);
        if (st.setup.tamper)
          st.setup.tamper(version, chunk, bytes);
        return caf::make_result(sum, std::move(bytes));
      },
      [self](push_atom, std::string& name, int64_t version) -> caf::result<bool> {
        auto& st = self->state;
        auto it = st.subscribers.find(name);
        if (it == st.subscribers.end() || !it->second.bulk_sender)
          return caf::make_error(caf::sec::invalid_argument, "no bulk link to " + name);
        auto* h = find_version(st, version);
        local_weights w = h ? h->weights : local_weights{version, nullptr};
        auto m = h ? h->packed_manifest : packed<weight_manifest>{};
        auto promise = self->make_response_promise<bool>();
        self->request(it->second.bulk_sender, st.setup.timeout, push_atom::value, std::move(w), std::move(m))
            .then([promise](bool sent) mutable { promise.deliver(sent); },
                  [promise](caf::error& err) mutable { promise.deliver(std::move(err)); });
        return promise;
      },
      [self](weight_delivery& report) { record(self, report); },
  };
}

}  // namespace

weight_publisher_actor spawn_weight_publisher(caf::actor_system& sys, weight_publisher_setup setup) {
  return sys.spawn(publisher_behavior, std::move(setup));
}

}  // namespace areal
