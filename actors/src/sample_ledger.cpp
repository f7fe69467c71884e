// The sample ledger (see sample_ledger.hpp).
#include "areal/actors/sample_ledger.hpp"

#include <algorithm>
#include <stdexcept>

namespace areal {

std::string to_string(const sample_id& id) {
  return "sample " + std::to_string(id.index) + " of group " + std::to_string(id.group);
}

const char* to_string(sample_stage x) {
  switch (x) {
    case sample_stage::queued:
      return "queued";
    case sample_stage::generating:
      return "generating";
    case sample_stage::scoring:
      return "scoring";
    case sample_stage::buffered:
      return "buffered";
    case sample_stage::training:
      return "training";
    case sample_stage::trained:
      return "trained";
    case sample_stage::dropped:
      return "dropped";
  }
  return "?";
}

sample_entry& sample_ledger::at(sample_id id, std::initializer_list<sample_stage> allowed, const char* what) {
  auto it = entries_.find(id);
  if (it == entries_.end())
    throw std::logic_error("sample ledger: " + to_string(id) + " " + what + " but it was never admitted");
  if (std::find(allowed.begin(), allowed.end(), it->second.stage) == allowed.end())
    throw std::logic_error("sample ledger: " + to_string(id) + " " + what + " while " + to_string(it->second.stage));
  return it->second;
}

void sample_ledger::admit(sample_id id, uint64_t prompt_position, int64_t version) {
  auto [it, fresh] = entries_.try_emplace(id);
  if (!fresh)
    throw std::logic_error("sample ledger: " + to_string(id) + " admitted twice");
  it->second.id = id;
  it->second.prompt_position = prompt_position;
  it->second.admitted_version = version;
  admitted_++;
}

void sample_ledger::dispatched(sample_id id, const std::string& worker) {
  auto& e = at(id, {sample_stage::queued}, "sent to a rollout worker");
  e.stage = sample_stage::generating;
  e.holder = worker;
  e.attempts++;
}

void sample_ledger::retry(sample_id id, const std::string& why) {
  auto& e = at(id, {sample_stage::generating}, "failed");
  e.stage = sample_stage::queued;
  e.holder.clear();
  e.retries++;
  e.reason = why;
}

void sample_ledger::generated(sample_id id, const std::string& pool) {
  auto& e = at(id, {sample_stage::generating}, "generated");
  e.stage = sample_stage::scoring;
  e.holder = pool;
}

void sample_ledger::scoring_at(sample_id id, const std::string& pool) {
  auto& e = at(id, {sample_stage::scoring}, "sent to a reward pool");
  e.holder = pool;
}

void sample_ledger::scored(sample_id id) {
  auto& e = at(id, {sample_stage::scoring}, "scored");
  e.stage = sample_stage::buffered;
  e.holder.clear();
}

void sample_ledger::batched(sample_id id, int64_t step) {
  auto& e = at(id, {sample_stage::buffered}, "batched");
  e.stage = sample_stage::training;
  e.step = step;
}

void sample_ledger::trained(sample_id id) {
  auto& e = at(id, {sample_stage::training}, "trained");
  e.stage = sample_stage::trained;
  trained_++;
}

void sample_ledger::dropped(sample_id id, const std::string& reason) {
  auto& e = at(id,
               {sample_stage::queued, sample_stage::generating, sample_stage::scoring, sample_stage::buffered,
                sample_stage::training},
               "dropped");
  e.stage = sample_stage::dropped;
  e.holder.clear();
  e.reason = reason;
  drop_reasons_[reason]++;
  dropped_++;
}

void sample_ledger::drop_group(uint64_t group, const std::string& reason) {
  for (auto it = entries_.lower_bound({group, 0}); it != entries_.end() && it->first.group == group; ++it)
    if (it->second.stage != sample_stage::trained && it->second.stage != sample_stage::dropped)
      dropped(it->first, reason);
}

std::optional<sample_entry> sample_ledger::where(sample_id id) const {
  auto it = entries_.find(id);
  if (it == entries_.end())
    return std::nullopt;
  return it->second;
}

std::vector<sample_entry> sample_ledger::unaccounted() const {
  std::vector<sample_entry> out;
  for (auto& [id, e] : entries_)
    if (e.stage != sample_stage::trained && e.stage != sample_stage::dropped)
      out.push_back(e);
  return out;
}

std::vector<sample_entry> sample_ledger::entries() const {
  std::vector<sample_entry> out;
  out.reserve(entries_.size());
  for (auto& [id, e] : entries_)
    out.push_back(e);
  return out;
}

}  // namespace areal
