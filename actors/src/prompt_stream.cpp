// The prompt stream (see prompt_stream.hpp).
#include "areal/actors/prompt_stream.hpp"

#include <stdexcept>

namespace areal {

uint64_t sample_seed(uint64_t run_seed, uint64_t group, uint32_t index) {
  // (group, index) -> group * 2^32 + index is injective for groups below 2^32;
  // adding a constant and the splitmix64 finalizer are bijections of 64 bits.
  uint64_t z = (group << 32 | index) + run_seed * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

prompt_stream::prompt_stream(std::unique_ptr<tasks::task_source> source, encoder encode, int64_t group_size,
                             sampling_params sampling, uint64_t seed)
    : source_(std::move(source)),
      encode_(std::move(encode)),
      group_size_(group_size),
      sampling_(std::move(sampling)),
      seed_(seed) {
  if (!source_ || !encode_ || group_size_ <= 0)
    throw std::invalid_argument("prompt stream: a source, an encoder and a positive group size are needed");
}

void prompt_stream::restore(const stream_position& p) {
  open_.clear();  // a stream going back to a checkpoint forgets what it started since
  pending_.clear();
  source_->restore(p.source_position);
  dropped_positions_ = p.dropped_positions;
  next_group_ = p.next_group;
  bool with_ids = p.requeue_groups.size() == p.requeue.size();
  requeue_.clear();
  for (size_t k = 0; k < p.requeue.size(); ++k)
    requeue_.push_back({p.requeue[k], with_ids ? p.requeue_groups[k] : next_group_++});
  saved_.clear();
  saved_unused_ = 0;
  saved_past_group_ = 0;
  for (auto& s : p.saved) {
    auto& t = s.segments.front();
    if (static_cast<int64_t>(t.sample_index) >= group_size_)
      saved_past_group_++;  // saved by a run of larger groups: no group of this run has its index
    else if (!with_ids || !saved_.emplace(std::make_pair(t.group_id, t.sample_index), s).second)
      saved_unused_++;
  }
}

stream_position prompt_stream::position() const {
  stream_position p;
  p.source_position = source_->position();
  for (auto& r : requeue_) {
    p.requeue.push_back(r.position);
    p.requeue_groups.push_back(r.group);
  }
  for (auto& [group, position] : open_) {  // by group id: the order they were started in
    p.requeue.push_back(position);
    p.requeue_groups.push_back(group);
  }
  p.dropped_positions = dropped_positions_;
  p.next_group = next_group_;
  return p;
}

std::vector<saved_sample> prompt_stream::saved_work() const {
  std::vector<saved_sample> out;
  for (auto& [id, s] : saved_)
    out.push_back(s);
  for (auto& s : pending_) {
    if (!s.scored.empty()) {
      out.push_back({s.scored, true});
    } else if (!s.request.so_far.tokens.empty()) {
      trajectory t;
      t.prompt_id = s.request.prompt_id;
      t.group_id = s.request.group_id;
      t.sample_index = s.request.sample_index;
      t.prompt_tokens = s.request.prompt_tokens;
      t.prompt_version = s.request.admitted_version;
      t.output_tokens = s.request.so_far.tokens;
      t.behaviour_logprobs = s.request.so_far.logprobs;
      t.token_versions = s.request.so_far.versions;
      t.finish = s.request.so_far.finish;
      out.push_back({{std::move(t)}, false});
    }
  }
  return out;
}

bool prompt_stream::start_group() {
  std::optional<tasks::task_item> item;
  uint64_t position = 0;
  std::optional<uint64_t> group_id;
  if (!requeue_.empty()) {
    auto resume_at = source_->position();
    position = requeue_.front().position;
    group_id = requeue_.front().group;
    requeue_.pop_front();
    source_->restore(position);
    item = source_->next();
    source_->restore(resume_at);
  } else {
    position = source_->position();
    item = source_->next();
  }
  if (!item)
    return false;
  auto task = std::make_shared<const reward_task>(item->task);
  auto ids = encode_(item->prompt);
  auto group = group_id ? *group_id : next_group_++;
  open_[group] = position;
  for (int64_t k = 0; k < group_size_; ++k) {
    stream_sample s;
    s.request.prompt_id = item->id;
    s.request.group_id = group;
    s.request.sample_index = static_cast<uint32_t>(k);
    s.request.prompt_tokens = ids;
    s.request.sampling = sampling_;
    s.request.seed = sample_seed(seed_, group, static_cast<uint32_t>(k));
    s.task = task;
    s.prompt_position = position;
    if (auto saved = saved_.find({group, static_cast<uint32_t>(k)}); saved != saved_.end()) {
      auto& work = saved->second;
      if (work.segments.front().prompt_tokens != ids) {
        saved_unused_++;  // the task file changed under the run: generated anew
      } else {
        s.request.admitted_version = work.segments.front().prompt_version;  // its tokens are as old as they are
        if (work.scored) {
          s.scored = std::move(work.segments);
        } else {
          auto& t = work.segments.front();
          s.request.so_far = {t.output_tokens, t.behaviour_logprobs, t.token_versions, t.finish};
        }
      }
      saved_.erase(saved);
    }
    pending_.push_back(std::move(s));
  }
  return true;
}

std::optional<stream_sample> prompt_stream::next() {
  if (pending_.empty() && !start_group())
    return std::nullopt;
  auto s = std::move(pending_.front());
  pending_.pop_front();
  return s;
}

void prompt_stream::generate_again(stream_sample s) {
  s.admitted = true;
  pending_.push_front(std::move(s));
}

std::optional<uint64_t> prompt_stream::close_trained(uint64_t group) {
  auto it = open_.find(group);
  if (it == open_.end())
    return std::nullopt;
  auto position = it->second;
  open_.erase(it);
  return position;
}

void prompt_stream::close_dropped(uint64_t group) {
  auto it = open_.find(group);
  if (it == open_.end())
    return;
  dropped_positions_.push_back(it->second);
  open_.erase(it);
}

}  // namespace areal
