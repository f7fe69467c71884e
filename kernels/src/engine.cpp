#include "areal/kernels/engine.hpp"
#include "decode_graphs.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include "areal/kernels/fused_layers.hpp"
#include "cpu_kernels.hpp"

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)
#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <stdexcept>

namespace areal::kernels {

namespace {

sampled_token sample_from_logits(const float* row, int64_t vocab, const sampling_params& params,
                                 at::Generator& generator) {
  bool greedy = params.greedy || params.temperature <= 0;
  auto pick = cpu::sample_row(row, vocab, params.temperature, greedy, params.top_k, params.top_p,
                              greedy ? 0.0 : draw_uniform(generator));
  return {pick.token, pick.logprob};
}

// Positions `count` new tokens attend over when `cached` tokens precede them (causal).
int64_t attended(int64_t cached, int64_t count) {
  return count * cached + count * (count + 1) / 2;
}

}  // namespace

sampled_token sample_token(const at::Tensor& logits, const sampling_params& params, at::Generator& generator) {
  auto row = logits.to(at::kFloat).to(at::kCPU).contiguous().view({-1});
  return sample_from_logits(row.data_ptr<float>(), row.numel(), params, generator);
}

int32_t generation_engine::sequence::token_at(int64_t i) const {
  auto prompt = static_cast<int64_t>(job.prompt.size());
  return i < prompt ? job.prompt[static_cast<size_t>(i)] : out.tokens[static_cast<size_t>(i - prompt)];
}

generation_engine::generation_engine(policy_model& model, engine_config config, int64_t version)
    : model_(model),
      config_(config),
      cache_(model.config(), config.slots, std::min(config.max_seq_len, model.config().max_position_embeddings),
             model.options(), std::max<int64_t>(config.prompt_pool_tokens, 0)),
      version_(version) {
  if (config_.slots <= 0 || config_.prefill_chunk <= 0 || config_.max_seq_len <= 1)
    throw std::invalid_argument("engine: slots, prefill_chunk and max_seq_len must be positive");
  if (config_.prompt_pool_tokens < 0 || config_.min_shared_prompt < 1)
    throw std::invalid_argument("engine: prompt_pool_tokens must be 0 or more and min_shared_prompt at least 1");
  if (!config_.cuda_graphs)
    cache_.graphs.reset();
  active_.reserve(static_cast<size_t>(config_.slots));
}

void generation_engine::submit(generation_job job) {
  if (job.prompt.empty())
    throw std::invalid_argument("request " + std::to_string(job.id) + ": empty prompt");
  auto need = static_cast<int64_t>(job.prompt.size()) + job.sampling.max_new_tokens;
  if (need > cache_.max_len())
    throw std::invalid_argument("request " + std::to_string(job.id) + ": prompt (" + std::to_string(job.prompt.size()) +
                                ") + max_new_tokens (" + std::to_string(job.sampling.max_new_tokens) +
                                ") exceeds the engine's max_seq_len " + std::to_string(cache_.max_len()));
  auto& so_far = job.so_far;
  for (auto& tokens : {std::cref(job.prompt), std::cref(so_far.tokens)})
    for (auto t : tokens.get())
      if (t < 0 || t >= model_.config().vocab_size)
        throw std::invalid_argument("request " + std::to_string(job.id) + ": token " + std::to_string(t) +
                                    " outside the vocabulary");
  if (so_far.finish != finish_reason::unfinished || so_far.logprobs.size() != so_far.tokens.size() ||
      so_far.versions.size() != so_far.tokens.size() || so_far.tokens.size() >= job.sampling.max_new_tokens)
    throw std::invalid_argument("request " + std::to_string(job.id) + ": its output so far (" +
                                std::to_string(so_far.tokens.size()) + " tokens, ended " + to_string(so_far.finish) +
                                ") cannot be continued");
  queue_.push_back(std::move(job));
}

void generation_engine::update_weights(int64_t version, at::Tensor weights) {
  if (weights.numel() != model_.flat().numel())
    throw std::invalid_argument("update_weights: " + std::to_string(weights.numel()) + " values for a model of " +
                                std::to_string(model_.flat().numel()) + " parameters");
  pending_update_ = std::make_pair(version, std::move(weights));
}

interruption_mode parse_interruption(const std::string& name) {
  if (name == "reprefill")
    return interruption_mode::reprefill;
  if (name == "keep_cache")
    return interruption_mode::keep_cache;
  if (name == "wait")
    return interruption_mode::wait;
  throw std::invalid_argument("interruption \"" + name + "\": use reprefill, keep_cache or wait");
}

void generation_engine::apply_pending_update() {
  if (!pending_update_)
    return;
  if (config_.interruption == interruption_mode::wait && !active_.empty())
    return;  // waiting mode: the swap happens once the in-flight sequences are done
  {
    auto start = std::chrono::steady_clock::now();
    at::NoGradGuard no_grad;
    model_.flat().copy_(pending_update_->second);
    counters_.weight_apply_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    counters_.weight_updates++;
  }
  version_ = pending_update_->first;
  pending_update_.reset();
  weight_generation_++;  // no new sequence attaches to a prefix the old weights computed
  for (auto it = prefixes_.begin(); it != prefixes_.end();)
    it = it->second.users == 0 ? prefixes_.erase(it) : std::next(it);
  if (!active_.empty())
    counters_.interruptions++;
  if (config_.interruption == interruption_mode::keep_cache)
    return;  // the caches (and the prefixes in use) stay as the old weights computed them
  for (size_t slot = 0; slot < active_.size(); ++slot) {
    release_prefix(active_[slot]);
    active_[slot].fed = 0;  // caches dropped: recomputed with the new weights (sharing again)
    active_[slot].reprefill = true;
    cache_.reset_slot(static_cast<int64_t>(slot));
  }
}

void generation_engine::admit() {
  bool waiting_for_swap = pending_update_.has_value() && config_.interruption == interruption_mode::wait;
  while (!waiting_for_swap && !queue_.empty() && static_cast<int64_t>(active_.size()) < config_.slots) {
    sequence s;
    s.job = std::move(queue_.front());
    queue_.pop_front();
    s.out.id = s.job.id;
    s.out.prompt = s.job.prompt;
    s.generator = at::make_generator<at::CPUGeneratorImpl>(s.job.seed);
    if (!s.job.so_far.tokens.empty()) {  // resumed: computed again with these weights, not sampled again
      s.out.tokens = std::move(s.job.so_far.tokens);
      s.out.logprobs = std::move(s.job.so_far.logprobs);
      s.out.versions = std::move(s.job.so_far.versions);
      s.reprefill = true;
      if (!(s.job.sampling.greedy || s.job.sampling.temperature <= 0))  // as sample_from_logits draws
        for (size_t k = 0; k < s.out.tokens.size(); ++k)
          draw_uniform(s.generator);
    }
    cache_.reset_slot(static_cast<int64_t>(active_.size()));
    active_.push_back(std::move(s));
  }
}

std::vector<generation_output> generation_engine::step() {
  apply_pending_update();
  admit();
  std::vector<generation_output> finished;
  if (active_.empty())
    return finished;

  // Sequences that start now read their prompt from the pool where it is shared.
  for (size_t slot = 0; slot < active_.size(); ++slot)
    if (active_[slot].fed == 0 && active_[slot].prefix == 0) {
      active_[slot].cache_weights = weight_generation_;
      attach_prefix(slot);
    }
  // Pool entries still to compute come first (their users wait for them), then
  // one token per decoding sequence and prompt chunks for the others, oldest first;
  // a sequence whose whole prompt is a ready entry's samples from its logits.
  step_input input;
  std::vector<int64_t> fill_tokens;
  // Pool entries whose last row this step computes, and that row's index in fill_tokens.
  std::vector<std::pair<uint64_t, int64_t>> completed;
  int64_t budget = config_.prefill_chunk;
  for (auto& [id, p] : prefixes_) {
    if (p.ready() || p.users == 0 || budget == 0)
      continue;
    auto count = std::min(p.size() - p.filled, budget);
    input.fills.push_back({p.at, p.filled, count});
    if (p.filled + count == p.size())
      completed.emplace_back(id, static_cast<int64_t>(fill_tokens.size()) + count - 1);
    counters_.prefill_attended_tokens += static_cast<uint64_t>(attended(p.filled, count));
    fill_tokens.insert(fill_tokens.end(), p.tokens.begin() + p.filled, p.tokens.begin() + p.filled + count);
    (p.for_reprefill ? counters_.reprefill_tokens : counters_.prefill_tokens) += static_cast<uint64_t>(count);
    p.filled += count;
    budget -= count;
  }
  std::vector<size_t> ready;        // sequences that consume their last pending token now
  std::vector<int64_t> ready_rows;  // row of that token in the step
  std::vector<size_t> from_pool;    // sequences that sample their first token from their prompt's pool entry
  int64_t row = 0;
  for (size_t slot = 0; slot < active_.size(); ++slot) {
    auto& s = active_[slot];
    if (s.prefix != 0 && !prefixes_.at(s.prefix).ready())
      continue;  // its prompt is still being computed in the pool
    auto pending = s.total() - s.fed;
    if (pending == 0) {  // the whole prompt is a pool entry's: its last row's logits give the first token
      from_pool.push_back(slot);
      continue;
    }
    auto count = pending == 1 ? int64_t{1} : std::min(pending, budget);
    if (count <= 0)
      continue;
    if (pending > 1)
      budget -= count;
    for (int64_t i = 0; i < count; ++i)
      input.tokens.push_back(s.token_at(s.fed + i));
    input.slots.push_back(static_cast<int64_t>(slot));
    input.counts.push_back(count);
    if (pending > 1) {
      (s.reprefill ? counters_.reprefill_tokens : counters_.prefill_tokens) += static_cast<uint64_t>(count);
      counters_.prefill_attended_tokens += static_cast<uint64_t>(attended(s.fed, count));
    } else {
      counters_.decode_rows++;
      counters_.decode_context_tokens += static_cast<uint64_t>(s.fed + 1);
    }
    s.fed += count;
    row += count;
    if (s.fed == s.total()) {
      ready.push_back(slot);
      ready_rows.push_back(row - 1);
    }
  }
  input.tokens.insert(input.tokens.end(), fill_tokens.begin(), fill_tokens.end());
  if (input.tokens.empty() && from_pool.empty())
    return finished;
  auto start = std::chrono::steady_clock::now();
  at::Tensor logits;
  if (!input.tokens.empty()) {
    at::NoGradGuard no_grad;
    auto hidden = model_.forward_cached(cache_, input);
    counters_.steps++;
    if (cache_.graphs) {
      counters_.graph_replays = cache_.graphs->replays();
      counters_.graph_captures = cache_.graphs->captures();
    }
    auto rows = ready_rows;
    for (auto& [id, at_fill] : completed)
      rows.push_back(row + at_fill);
    if (!rows.empty())
      logits = model_.logits(hidden.index_select(0, at::tensor(rows, at::kLong).to(hidden.device())));
    for (size_t i = 0; i < completed.size(); ++i) {  // kept for every member, now and later
      auto& p = prefixes_.at(completed[i].first);
      p.logits = logits[static_cast<int64_t>(ready.size() + i)].clone();
    }
    if (!completed.empty())
      logits = logits.narrow(0, 0, static_cast<int64_t>(ready.size()));
  }
  if (!from_pool.empty()) {
    std::vector<at::Tensor> rows;
    if (!ready.empty())
      rows.push_back(logits);
    for (auto slot : from_pool) {
      auto& p = prefixes_.at(active_[slot].prefix);
      if (!p.logits.defined())
        throw std::logic_error("engine: a sequence waits for a first token its pool entry does not keep");
      rows.push_back(p.logits.unsqueeze(0));
      ready.push_back(slot);
      counters_.pool_first_tokens++;
    }
    logits = at::cat(rows);
  }
  if (!ready.empty()) {
    at::NoGradGuard no_grad;
    // One draw per sequence from its own generator, so that a seed's tokens do
    // not depend on what else is in the batch.
    std::vector<sampled_token> picks(ready.size());
    if (logits.device().is_cpu() && fused::enabled()) {
      // The CPU's loop over each row, rows in parallel.
      logits = logits.to(at::kFloat).contiguous();
      auto vocab = logits.size(1);
      const float* base = logits.data_ptr<float>();
      at::parallel_for(0, static_cast<int64_t>(ready.size()), 1, [&](int64_t begin, int64_t end) {
        for (auto i = begin; i < end; ++i) {
          auto& s = active_[ready[static_cast<size_t>(i)]];
          picks[static_cast<size_t>(i)] = sample_from_logits(base + i * vocab, vocab, s.job.sampling, s.generator);
        }
      });
    } else {
      // On the logits' device: only the tokens come back to the host.
      std::vector<const sampling_params*> params;
      std::vector<double> uniforms;
      for (auto slot : ready) {
        auto& s = active_[slot];
        params.push_back(&s.job.sampling);
        bool greedy = s.job.sampling.greedy || s.job.sampling.temperature <= 0;
        uniforms.push_back(greedy ? 0.0 : draw_uniform(s.generator));
      }
      picks = sample_rows(logits, params, uniforms);
    }
    for (size_t i = 0; i < ready.size(); ++i) {
      auto& s = active_[ready[i]];
      s.reprefill = false;
      auto& pick = picks[i];
      s.out.tokens.push_back(static_cast<int32_t>(pick.token));
      s.out.logprobs.push_back(pick.logprob);
      s.out.versions.push_back(version_);
      counters_.decode_tokens++;
      auto& stops = s.job.sampling.stop_tokens;
      if (std::find(stops.begin(), stops.end(), static_cast<int32_t>(pick.token)) != stops.end())
        s.out.finish = finish_reason::stop;
      else if (s.out.tokens.size() >= s.job.sampling.max_new_tokens)
        s.out.finish = finish_reason::length;
    }
  }
  counters_.forward_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Finished sequences leave; the last slot moves into each hole (highest holes first).
  for (size_t slot = active_.size(); slot-- > 0;) {
    if (active_[slot].out.finish == finish_reason::unfinished)
      continue;
    release_prefix(active_[slot]);
    finished.push_back(std::move(active_[slot].out));
    remove_slot(slot);
  }
  return finished;
}

void generation_engine::remove_slot(size_t slot) {
  auto last = active_.size() - 1;
  if (slot != last) {
    cache_.move_slot(static_cast<int64_t>(last), static_cast<int64_t>(slot));
    active_[slot] = std::move(active_[last]);
  }
  cache_.reset_slot(static_cast<int64_t>(last));
  active_.pop_back();
}

bool generation_engine::has_sibling(size_t slot) const {
  // Another sequence about to start with the same prompt: a group member
  // admitted with it, or one near the front of the queue.
  auto& prompt = active_[slot].job.prompt;
  auto same = [&](const std::vector<int32_t>& other) { return other == prompt; };
  for (size_t i = 0; i < active_.size(); ++i)
    if (i != slot && active_[i].fed == 0 && active_[i].prefix == 0 && same(active_[i].job.prompt))
      return true;
  auto look = std::min(queue_.size(), static_cast<size_t>(config_.slots));
  for (size_t i = 0; i < look; ++i)
    if (same(queue_[i].prompt))
      return true;
  return false;
}

int64_t generation_engine::allocate_pool(int64_t rows) {
  for (;;) {
    // First fit between the entries, ordered by their rows.
    std::vector<std::pair<int64_t, int64_t>> used;
    for (auto& [id, p] : prefixes_)
      used.emplace_back(p.at, p.at + p.size());
    std::sort(used.begin(), used.end());
    int64_t free_from = 0;
    for (auto& [begin, end] : used) {
      if (begin - free_from >= rows)
        return free_from;
      free_from = std::max(free_from, end);
    }
    if (cache_.pool_tokens() - free_from >= rows)
      return free_from;
    // No room: evict the least recently used entry nobody reads.
    auto victim = prefixes_.end();
    for (auto it = prefixes_.begin(); it != prefixes_.end(); ++it)
      if (it->second.users == 0 && (victim == prefixes_.end() || it->second.last_used < victim->second.last_used))
        victim = it;
    if (victim == prefixes_.end())
      return -1;
    prefixes_.erase(victim);
  }
}

void generation_engine::attach_prefix(size_t slot) {
  auto& s = active_[slot];
  auto shared = static_cast<int64_t>(s.job.prompt.size());
  if (config_.prompt_pool_tokens <= 0 || shared < config_.min_shared_prompt || shared > cache_.pool_tokens())
    return;
  auto begins_prompt = [&](const prompt_prefix& p) {
    return p.weights == weight_generation_ && p.size() <= shared &&
           std::equal(p.tokens.begin(), p.tokens.end(), s.job.prompt.begin());
  };
  uint64_t chosen = 0, longest = 0;
  int64_t longest_size = 0;
  for (auto& [id, p] : prefixes_) {
    if (!begins_prompt(p))
      continue;
    if (p.size() == shared)
      chosen = id;
    else if (p.ready() && p.size() > longest_size) {
      longest = id;
      longest_size = p.size();
    }
  }
  // A member of the group already running with the prompt in its own slot
  // (it started alone: its siblings arrived later) can give its rows.
  std::optional<size_t> donor;
  for (size_t i = 0; chosen == 0 && !donor && i < active_.size(); ++i) {
    auto& o = active_[i];
    if (i != slot && o.prefix == 0 && o.fed >= shared && o.cache_weights == weight_generation_ &&
        static_cast<int64_t>(o.job.prompt.size()) >= shared &&
        std::equal(o.job.prompt.begin(), o.job.prompt.begin() + shared, s.job.prompt.begin()))
      donor = i;
  }
  if (chosen == 0) {
    // A new entry pays when another sequence will read it too, or when most of
    // it can be copied from an entry this prompt extends or a running sibling.
    if (!donor && !has_sibling(slot) && longest_size < config_.min_shared_prompt)
      return;
    auto at = allocate_pool(shared);
    if (at < 0)
      return;  // the pool is full of prompts in use: this sequence prefills its own
    prompt_prefix p;
    p.tokens.assign(s.job.prompt.begin(), s.job.prompt.begin() + shared);
    p.at = at;
    p.weights = weight_generation_;
    p.for_reprefill = s.reprefill;
    if (donor) {
      cache_.copy_slot_to_pool(static_cast<int64_t>(*donor), at, shared);
      p.filled = shared;
      counters_.pool_copied_tokens += static_cast<uint64_t>(shared);
    } else if (longest != 0) {  // allocate_pool evicts only unused entries; `longest` may be one of them
      auto source = prefixes_.find(longest);
      if (source != prefixes_.end()) {
        cache_.copy_pool_rows(source->second.at, at, longest_size);
        p.filled = longest_size;
        counters_.pool_copied_tokens += static_cast<uint64_t>(longest_size);
      }
    }
    chosen = next_prefix_id_++;
    prefixes_.emplace(chosen, std::move(p));
  }
  auto& p = prefixes_.at(chosen);
  // A member still to sample its first token computes the prompt's last row
  // itself where the entry keeps no logits (its rows were copied).
  auto read = s.out.tokens.empty() && !p.gives_logits() ? shared - 1 : shared;
  p.users++;
  p.last_used = counters_.steps;
  s.prefix = chosen;
  s.fed = read;
  cache_.reset_slot(static_cast<int64_t>(slot), read, p.at);
  counters_.shared_prompt_tokens += static_cast<uint64_t>(read);
}

void generation_engine::release_prefix(sequence& s) {
  if (s.prefix == 0)
    return;
  auto it = prefixes_.find(s.prefix);
  s.prefix = 0;
  if (it == prefixes_.end())
    return;
  it->second.users--;
  if (it->second.users == 0 && it->second.weights != weight_generation_)
    prefixes_.erase(it);  // computed by old weights: nobody can attach again
}

std::vector<generation_output> generation_engine::run_to_completion() {
  std::vector<generation_output> all;
  while (!idle()) {
    auto done = step();
    all.insert(all.end(), std::make_move_iterator(done.begin()), std::make_move_iterator(done.end()));
  }
  return all;
}

std::vector<generation_output> generation_engine::in_flight() const {
  std::vector<generation_output> out;
  for (auto& s : active_)
    out.push_back(s.out);
  return out;
}

std::optional<generation_output> generation_engine::cancel(uint64_t id) {
  for (auto q = queue_.begin(); q != queue_.end(); ++q)
    if (q->id == id) {
      generation_output o;
      o.id = id;
      o.prompt = q->prompt;
      o.finish = finish_reason::aborted;
      queue_.erase(q);
      return o;
    }
  for (size_t slot = 0; slot < active_.size(); ++slot) {
    if (active_[slot].job.id != id)
      continue;
    release_prefix(active_[slot]);
    auto out = std::move(active_[slot].out);
    out.finish = finish_reason::aborted;
    remove_slot(slot);
    return out;
  }
  return std::nullopt;
}

const generation_output* generation_engine::running_output(uint64_t id) const {
  for (auto& s : active_)
    if (s.job.id == id)
      return &s.out;
  return nullptr;
}

std::vector<generation_output> generation_engine::abort_all() {
  std::vector<generation_output> out;
  for (auto& s : active_) {
    s.out.finish = finish_reason::aborted;
    out.push_back(std::move(s.out));
  }
  active_.clear();
  prefixes_.clear();
  for (int64_t slot = 0; slot < cache_.slots(); ++slot)
    cache_.reset_slot(slot);
  for (auto& job : queue_) {
    generation_output o;
    o.id = job.id;
    o.prompt = job.prompt;
    o.finish = finish_reason::aborted;
    out.push_back(std::move(o));
  }
  queue_.clear();
  return out;
}

}  // namespace areal::kernels
