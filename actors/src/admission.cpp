// The staleness gate and the group buffer (see admission.hpp).
#include "areal/actors/admission.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace areal {

staleness_gate::staleness_gate(int64_t batch_size, int64_t eta, int64_t max_concurrent)
    : batch_size_(batch_size), eta_(eta), max_concurrent_(max_concurrent) {
  if (batch_size <= 0 || eta < 0 || max_concurrent <= 0)
    throw std::invalid_argument("staleness gate: batch size and max_concurrent must be positive, eta non-negative");
}

int64_t staleness_gate::admission_version(const std::string& node) const {
  if (!follows_deliveries_)
    return version_;
  auto it = node.empty() ? delivered_to_.end() : delivered_to_.find(node);
  return std::min(version_, it == delivered_to_.end() ? delivered_ : std::max(delivered_, it->second));
}

int64_t staleness_gate::capacity(const std::string& node) const {
  auto by_concurrency = max_concurrent_ - running_;
  auto by_staleness = (eta_ + admission_version(node) + 1) * batch_size_ - (accepted_ + running_);
  auto by_length = limit_ - (accepted_ + running_);
  return std::max<int64_t>(0, std::min({by_concurrency, by_staleness, by_length}));
}

void staleness_gate::limit_total(int64_t trajectories) {
  limit_ = trajectories;
}

void staleness_gate::admit(int64_t n, const std::string& node) {
  if (n > capacity(node))
    throw std::logic_error("staleness gate: admitting " + std::to_string(n) + " with capacity " +
                           std::to_string(capacity(node)));
  running_ += n;
  admitted_total_ += n;
}

void staleness_gate::finish(bool delivered) {
  if (running_ <= 0)
    throw std::logic_error("staleness gate: a request finished but none was running");
  --running_;
  if (delivered)
    ++accepted_;
}

void staleness_gate::discard(int64_t n) {
  accepted_ = std::max<int64_t>(0, accepted_ - n);
}

void staleness_gate::set_version(int64_t version) {
  version_ = version;
}

void staleness_gate::follow_deliveries() {
  follows_deliveries_ = true;
  delivered_ = version_;
}

void staleness_gate::delivered(int64_t version) {
  delivered_ = std::max(delivered_, version);
}

void staleness_gate::delivered_to(const std::string& node, int64_t version) {
  auto& v = delivered_to_[node];
  v = std::max(v, version);
}

void staleness_gate::restore(int64_t version) {
  version_ = version;
  delivered_ = version;  // a resumed run waits for the rollout workers to hold it (controller_trainer.cpp)
  delivered_to_.clear();
  accepted_ = version * batch_size_;
  running_ = 0;
  admitted_total_ = accepted_;
}

group_buffer::group_buffer(int64_t group_size) : group_size_(group_size) {
  if (group_size <= 0)
    throw std::invalid_argument("group size must be positive");
}

namespace {

std::vector<uint64_t> slots_of(const std::vector<sample_summary>& members) {
  std::vector<uint64_t> out;
  for (auto& m : members)
    out.push_back(m.slot);
  return out;
}

}  // namespace

void group_buffer::add(sample_summary s) {
  auto id = s.group_id;
  partial_[id].members.push_back(std::move(s));
  settle(id);
}

void group_buffer::drop_sample(uint64_t group_id, const std::string& reason) {
  auto& g = partial_[group_id];
  g.missing_dropped++;
  if (g.drop_reason.empty())
    g.drop_reason = reason;
  settle(group_id);
}

void group_buffer::settle(uint64_t group_id) {
  auto it = partial_.find(group_id);
  auto& g = it->second;
  if (static_cast<int64_t>(g.members.size()) + g.missing_dropped < group_size_)
    return;
  if (g.missing_dropped == 0) {
    int64_t oldest = INT64_MAX;
    for (auto& t : g.members)
      oldest = std::min(oldest, oldest_version(t, INT64_MAX));
    ready_ += static_cast<int64_t>(g.members.size());
    auto at = std::upper_bound(complete_.begin(), complete_.end(), oldest,
                               [](int64_t v, const complete_group& c) { return v < c.oldest; });
    complete_.insert(at, {std::move(g.members), oldest});
  } else {
    dropped_[g.drop_reason] += static_cast<int64_t>(g.members.size()) + g.missing_dropped;
    newly_dropped_.push_back({group_id, static_cast<int64_t>(g.members.size()), g.drop_reason, slots_of(g.members)});
  }
  partial_.erase(it);
}

std::optional<std::vector<sample_summary>> group_buffer::take_batch(int64_t batch_size, int64_t min_version,
                                                                    int64_t* stale_dropped) {
  while (!complete_.empty() && complete_.front().oldest < min_version) {
    auto& g = complete_.front();
    auto n = static_cast<int64_t>(g.members.size());
    dropped_["staler than the bound"] += n;
    newly_dropped_.push_back({g.members.front().group_id, n, "staler than the bound", slots_of(g.members)});
    if (stale_dropped)
      *stale_dropped += n;
    ready_ -= n;
    complete_.pop_front();
  }
  if (ready_ < batch_size)
    return std::nullopt;
  std::vector<sample_summary> batch;
  while (!complete_.empty() && static_cast<int64_t>(batch.size() + complete_.front().members.size()) <= batch_size) {
    ready_ -= static_cast<int64_t>(complete_.front().members.size());
    for (auto& t : complete_.front().members)
      batch.push_back(std::move(t));
    complete_.pop_front();
  }
  return batch;
}

std::vector<group_buffer::closed_group> group_buffer::take_dropped_groups() {
  return std::exchange(newly_dropped_, {});
}

}  // namespace areal
