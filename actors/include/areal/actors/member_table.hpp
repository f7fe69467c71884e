// The members of one role (rollout workers, or reward pools) taking part in a
// run, local or on other nodes, and the requests each of them holds: dispatch
// to the least loaded, the work of a request taken back exactly once (its reply,
// its failure, or its member's loss, whichever comes first). Free of CAF: the
// handle type is a parameter, so that it is tested with plain values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace areal {

template <class Handle, class Work>
class member_table {
 public:
  struct member {
    Handle handle;
    std::string node;  // empty: this process
    std::string name;  // for the log and the ledger
    int64_t load = 0;  // its requests in flight
  };

  /// Adds a member; nothing when it is in the table already. Returns its id.
  std::optional<uint64_t> add(Handle handle, std::string node, std::string name) {
    for (auto& [id, m] : members_)
      if (m.handle == handle)
        return std::nullopt;
    auto id = next_member_++;
    members_.emplace(id, member{std::move(handle), std::move(node), std::move(name), 0});
    by_load_.emplace(0, id);
    return id;
  }

  /// The member with the fewest requests in flight, when it has fewer than `limit`.
  /// Ties go to the member that joined first.
  std::optional<uint64_t> least_loaded(int64_t limit = INT64_MAX) const {
    return least_loaded(limit, [](const member&) { return true; });
  }
  /// The same among the members for which `allowed(member)` holds.
  template <typename Allowed>
  std::optional<uint64_t> least_loaded(int64_t limit, Allowed allowed) const {
    for (auto& [load, id] : by_load_) {
      if (load >= limit)
        return std::nullopt;
      if (allowed(members_.at(id)))
        return id;
    }
    return std::nullopt;
  }

  const member& at(uint64_t id) const { return members_.at(id); }

  /// A request of `work` to member `id`; returns the request's id.
  uint64_t send(uint64_t id, Work work) {
    change_load(members_.at(id), id, +1);
    auto request = next_request_++;
    requests_.emplace(request, std::make_pair(id, std::move(work)));
    return request;
  }

  /// The work of a request in flight (nothing when it was taken back).
  Work* work(uint64_t request) {
    auto it = requests_.find(request);
    return it == requests_.end() ? nullptr : &it->second.second;
  }

  /// The work of `request`, forgotten and its member's load released; nothing
  /// when the request is already forgotten (its member was lost and the work
  /// handed to another).
  std::optional<Work> take(uint64_t request) {
    auto it = requests_.find(request);
    if (it == requests_.end())
      return std::nullopt;
    auto work = std::move(it->second.second);
    if (auto m = members_.find(it->second.first); m != members_.end())
      change_load(m->second, m->first, -1);
    requests_.erase(it);
    return work;
  }

  /// The first member whose handle satisfies `match` is removed; its name and
  /// the work of its requests (oldest first) come back. Nothing when none matches.
  template <class Match>
  std::optional<std::pair<member, std::vector<Work>>> lose(Match match) {
    for (auto it = members_.begin(); it != members_.end(); ++it) {
      if (!match(it->second.handle))
        continue;
      auto id = it->first;
      by_load_.erase({it->second.load, id});
      std::pair<member, std::vector<Work>> out{std::move(it->second), {}};
      members_.erase(it);
      for (auto r = requests_.begin(); r != requests_.end();) {
        if (r->second.first == id) {
          out.second.push_back(std::move(r->second.second));
          r = requests_.erase(r);
        } else {
          ++r;
        }
      }
      out.first.load = 0;
      return out;
    }
    return std::nullopt;
  }

  /// Every request in flight is forgotten (their replies will find nothing); the members stay.
  void forget_requests() {
    requests_.clear();
    by_load_.clear();
    for (auto& [id, m] : members_) {
      m.load = 0;
      by_load_.emplace(0, id);
    }
  }

  /// Every member's handle, in the order they joined.
  std::vector<Handle> handles() const {
    std::vector<Handle> out;
    for (auto& [id, m] : members_)
      out.push_back(m.handle);
    return out;
  }

  size_t size() const { return members_.size(); }
  bool empty() const { return members_.empty(); }
  size_t requests() const { return requests_.size(); }

 private:
  void change_load(member& m, uint64_t id, int64_t by) {
    by_load_.erase({m.load, id});
    m.load += by;
    by_load_.emplace(m.load, id);
  }

  std::map<uint64_t, member> members_;
  // (load, member id) of every member: the least loaded first, at the cost of a
  // lookup per request instead of a pass over the members (hundreds of engines).
  std::set<std::pair<int64_t, uint64_t>> by_load_;
  std::map<uint64_t, std::pair<uint64_t, Work>> requests_;  // request id -> (member id, work)
  uint64_t next_member_ = 0, next_request_ = 0;
};

}  // namespace areal
