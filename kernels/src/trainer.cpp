#include "areal/kernels/trainer.hpp"

#include "areal/kernels/compute_threads.hpp"
#include "areal/kernels/device.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>

#include <ATen/core/grad_mode.h>  // at::NoGradGuard (LibTorch 2.x's ATen.h no longer brings it)

#include "areal/kernels/fused_layers.hpp"
#include "areal/kernels/logprobs.hpp"
#include "areal/kernels/packing.hpp"
#include "cpu_train_kernels.hpp"

namespace areal::kernels {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The elements [first, last) of n that part k of `parts` takes, when a flat buffer is split over threads.
std::pair<int64_t, int64_t> part_of(int64_t n, size_t k, size_t parts) {
  auto count = static_cast<size_t>(n);
  return {static_cast<int64_t>(count * k / parts), static_cast<int64_t>(count * (k + 1) / parts)};
}

int64_t count_trained(const std::vector<int32_t>& response, const std::vector<uint8_t>& loss_mask) {
  if (loss_mask.empty())
    return static_cast<int64_t>(response.size());
  return std::count_if(loss_mask.begin(), loss_mask.end(), [](uint8_t m) { return m != 0; });
}

/// The loss mask of a micro-batch's response tokens, in the order micro_batch_logprobs
/// returns them: a sample without a mask trains every token.
template <typename Sample>
at::Tensor micro_batch_loss_mask(const std::vector<Sample>& batch, const std::vector<size_t>& mb,
                                 const at::Device& device) {
  std::vector<float> keep;
  for (auto i : mb) {
    auto& m = batch[i].loss_mask;
    if (m.empty())
      keep.insert(keep.end(), batch[i].response.size(), 1.0f);
    else
      keep.insert(keep.end(), m.begin(), m.end());
  }
  return at::tensor(keep).to(device);
}

}  // namespace

trainer::trainer(policy_model& model, trainer_config config)
    : model_(model), config_(std::move(config)), rng_(config_.seed) {
  model_.set_trainable(true);
  auto opts = model_.flat().options().dtype(at::kFloat);
  adam_m_ = at::zeros({model_.flat().numel()}, opts);
  adam_v_ = at::zeros({model_.flat().numel()}, opts);
  if (config_.optimizer.schedule != "constant" && config_.optimizer.schedule != "cosine")
    throw std::invalid_argument("optimizer schedule \"" + config_.optimizer.schedule + "\": use constant or cosine");
  auto own = model_.flat().device();
  for (auto& name : config_.replica_devices) {
    auto device = tensor_options(name, "float32").device();  // throws where this LibTorch lacks it
    if (device.is_cpu() != own.is_cpu())
      throw std::invalid_argument("a replica on \"" + name + "\" beside a model on " + own.str() +
                                  ": the replicas of a trainer are all on the CPU or all on GPUs");
    replica_devices_.push_back(device);
  }
}

double trainer::learning_rate() const {
  auto& o = config_.optimizer;
  if (o.warmup_steps > 0 && step_ < o.warmup_steps)
    return o.lr * static_cast<double>(step_ + 1) / static_cast<double>(o.warmup_steps);
  if (o.schedule == "constant")
    return o.lr;
  auto span = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  auto progress = std::min(1.0, static_cast<double>(step_ - o.warmup_steps) / static_cast<double>(span));
  return o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

std::vector<std::vector<size_t>> trainer::plan(const std::vector<sequence_ref>& seqs,
                                               const std::vector<size_t>& members, size_t min_micro_batches) const {
  min_micro_batches = std::max<size_t>(1, std::min(min_micro_batches, members.size()));
  if (!config_.packed) {
    auto local = pack_fixed(members.size(), static_cast<size_t>(config_.padded_mb_sequences));
    for (auto& mb : local)
      for (auto& i : mb)
        i = members[i];
    return local;
  }
  // Units packed whole: a sample, or with shared prompts the samples of one prompt (a group), so that
  // its prompt is computed once in the step, not once in each micro-batch it would be spread over; its
  // tokens as micro_batch_logprobs computes them. A group longer than a micro-batch, or fewer groups than
  // micro-batches wanted, and the samples are packed one by one.
  std::vector<std::vector<size_t>> units;
  std::vector<int64_t> lengths;
  auto whole = [&](size_t i) { return static_cast<int64_t>(seqs[i].prompt->size() + seqs[i].response->size()); };
  if (config_.share_prompts) {
    std::map<std::vector<int32_t>, size_t> unit_of;
    for (auto i : members) {
      auto [at, fresh] = unit_of.try_emplace(*seqs[i].prompt, units.size());
      if (fresh) {
        units.emplace_back();
        lengths.push_back(static_cast<int64_t>(seqs[i].prompt->size()));
      }
      units[at->second].push_back(i);
      lengths[at->second] += static_cast<int64_t>(seqs[i].response->size()) - 1;
    }
    for (size_t u = 0; u < units.size(); ++u)
      if (units[u].size() == 1)
        lengths[u] = whole(units[u][0]);
    bool fits = std::all_of(lengths.begin(), lengths.end(), [&](int64_t n) { return n <= config_.max_tokens_per_mb; });
    if (!fits || units.size() < min_micro_batches) {
      units.clear();
      lengths.clear();
    }
  }
  if (units.empty())
    for (auto i : members) {
      units.push_back({i});
      lengths.push_back(whole(i));
    }
  std::vector<std::vector<size_t>> planned;
  for (auto& mb : pack_first_fit_decreasing(lengths, config_.max_tokens_per_mb, min_micro_batches)) {
    planned.emplace_back();
    for (auto u : mb)
      planned.back().insert(planned.back().end(), units[u].begin(), units[u].end());
  }
  return planned;
}

at::Tensor trainer::micro_batch_logprobs(policy_model& model, const std::vector<sequence_ref>& seqs,
                                         const std::vector<size_t>& members, int64_t* computed_tokens) {
  // Packed: sequences back to back; a prompt that several members share (a
  // group's samples) once, each member's response after it as a sequence that
  // continues it (policy_model::forward's parents). Padded: each extended with
  // token 0 to the micro-batch's longest, so that padding costs what it costs.
  int64_t longest = 0;
  for (auto i : members)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(seqs[i].prompt->size() + seqs[i].response->size()));
  bool share = config_.packed && config_.share_prompts;
  struct prompt_use {
    int members = 0;        // members of this micro-batch with the prompt
    int64_t sequence = -1;  // the prompt's own sequence, once packed
  };
  std::map<std::vector<int32_t>, prompt_use> sharers;
  auto can_share = [&](size_t i) { return share && !seqs[i].prompt->empty() && !seqs[i].response->empty(); };
  for (auto i : members)
    if (can_share(i))
      sharers[*seqs[i].prompt].members++;
  std::vector<int64_t> tokens, cu{0}, parents, rows, targets;
  for (auto i : members) {
    auto& p = *seqs[i].prompt;
    auto& r = *seqs[i].response;
    auto start = cu.back();
    auto shared = can_share(i) ? sharers.find(p) : sharers.end();
    if (shared != sharers.end() && shared->second.members > 1) {
      auto& use = shared->second;
      if (use.sequence < 0) {  // the prompt's first member: the prompt as a sequence of its own
        tokens.insert(tokens.end(), p.begin(), p.end());
        cu.push_back(start + static_cast<int64_t>(p.size()));
        use.sequence = static_cast<int64_t>(parents.size());
        parents.push_back(-1);
        start = cu.back();
      }
      auto prompt_seq = static_cast<size_t>(use.sequence);
      // Response token 0 is predicted by the prompt's last row, token j by this
      // sequence's row j - 1; its last token predicts nothing and is left out.
      rows.push_back(cu[prompt_seq + 1] - 1);
      targets.push_back(r[0]);
      for (size_t j = 1; j < r.size(); ++j) {
        rows.push_back(start + static_cast<int64_t>(j) - 1);
        targets.push_back(r[j]);
      }
      tokens.insert(tokens.end(), r.begin(), r.end() - 1);
      cu.push_back(start + static_cast<int64_t>(r.size()) - 1);
      parents.push_back(static_cast<int64_t>(prompt_seq));
      continue;
    }
    tokens.insert(tokens.end(), p.begin(), p.end());
    tokens.insert(tokens.end(), r.begin(), r.end());
    // Response token j is predicted by the hidden state at position |prompt| - 1 + j.
    for (size_t j = 0; j < r.size(); ++j) {
      rows.push_back(start + static_cast<int64_t>(p.size()) - 1 + static_cast<int64_t>(j));
      targets.push_back(r[j]);
    }
    auto length = static_cast<int64_t>(p.size() + r.size());
    if (!config_.packed)
      for (; length < longest; ++length)
        tokens.push_back(0);
    cu.push_back(start + length);
    parents.push_back(-1);
  }
  *computed_tokens += cu.back();
  bool any_parent = std::any_of(parents.begin(), parents.end(), [](int64_t p) { return p >= 0; });
  auto device = model.flat().device();
  auto hidden = model.forward(at::tensor(tokens).to(device), cu, any_parent ? parents : std::vector<int64_t>{});
  auto selected = hidden.index_select(0, at::tensor(rows).to(device));
  return chunked_token_logprobs(selected, model.output_weight(), at::tensor(targets).to(device), config_.temperature,
                                config_.logprob_chunk_elements, model.compute_dtype());
}

size_t trainer::replicas_now() const {
  if (!replica_devices_.empty())
    return 1 + replica_devices_.size();
  auto available = thread_count_ ? thread_count_() : config_.data_parallel;
  if (!model_.flat().device().is_cpu())
    return 1;  // on one GPU, one replica; threads are a CPU's way to use its cores
  // LibTorch 1.13's oneDNN bfloat16 products on the CPU corrupt memory when two threads run them at once: the
  // demo in bfloat16 on two replicas ended with std::bad_array_new_length or std::bad_alloc thrown inside
  // dnnl_primitive_create within 300 SFT steps in each of 10 runs (with areal's allocator or without). In
  // bfloat16 one replica computes, its products on every thread (oneDNN's own threads are safe).
  if (model_.compute_dtype() == at::kBFloat16)
    return 1;
  return static_cast<size_t>(std::max<int64_t>(1, available));
}

void trainer::for_micro_batches(const std::vector<std::vector<size_t>>& micro_batches, size_t available,
                                const std::function<void(policy_model&, const std::vector<size_t>&, size_t)>& work,
                                bool with_grad) {
  auto replicas = std::max<size_t>(1, std::min(available, micro_batches.size()));
  if (replicas == 1) {
    if (thread_count_)
      // One replica: every thread for its products.
      kernels::set_compute_threads(thread_count_());
    for (auto& mb : micro_batches)
      work(model_, mb, 0);
    return;
  }
  while (replicas_.size() + 1 < replicas) {
    auto options = model_.flat().options();
    if (!replica_devices_.empty())
      options = options.device(replica_devices_[replicas_.size()]);
    replicas_.push_back({std::make_unique<policy_model>(model_.config(), options), -1, false});
  }
  // The calling thread runs part 0 on one intra-op thread and gets its own count back after the pass
  // (left at one, a later pass of one micro-batch on this thread ran its products on one core).
  struct restore_threads {
    int count = at::get_num_threads();
    ~restore_threads() { kernels::set_compute_threads(count); }
  } restore;
  auto weights_version = model_.flat()._version();
  replica_threads_.run(replicas, [&](size_t k) {
    kernels::set_compute_threads(1);  // per thread: one core each
    auto& model = k == 0 ? model_ : *replicas_[k - 1].model;
    device_scope on_device(model.flat().device());  // its GPU's kernels launch there
    if (k > 0) {
      // Each replica's thread readies its own copy (the copies at once, not one after another on one core).
      // The work here is the replica threads' alone: measured on the demo, copying the weights for every
      // pass and zeroing the gradient here left the calling thread idle at the pass's end 15% of the
      // synchronous trainer's time.
      at::NoGradGuard no_grad;
      auto& replica = replicas_[k - 1];
      if (replica.weights_version != weights_version) {
        replica.model->flat().copy_(model_.flat());  // the parameters of this pass
        replica.weights_version = weights_version;
      }
      if (with_grad) {
        replica.model->set_trainable(true);
        if (!replica.grad_zero)
          replica.model->flat_grad().zero_();
        replica.grad_zero = false;
      }
    }
    c10::AutoGradMode mode(with_grad);  // grad mode is per thread too
    for (size_t i = k; i < micro_batches.size(); i += replicas)
      work(model, micro_batches[i], k);
  });
  if (with_grad) {
    // The replicas' gradients summed into the model's, each thread over its own part of the buffer,
    // and zeroed there for the next pass.
    replica_threads_.run(replicas, [&](size_t k) {
      at::NoGradGuard no_grad;
      auto [begin, end] = part_of(model_.flat_grad().numel(), k, replicas);
      auto sum = model_.flat_grad().narrow(0, begin, end - begin);
      for (size_t r = 0; r + 1 < replicas; ++r) {
        auto part = replicas_[r].model->flat_grad().narrow(0, begin, end - begin);
        sum.add_(part.to(sum.device()));  // from another GPU: a copy first
        part.zero_();
      }
    });
    for (size_t r = 0; r + 1 < replicas; ++r)
      replicas_[r].grad_zero = true;
  }
}

std::vector<std::vector<float>> trainer::response_logprobs(const std::vector<std::vector<int32_t>>& prompts,
                                                           const std::vector<std::vector<int32_t>>& responses) {
  at::NoGradGuard no_grad;
  std::vector<sequence_ref> seqs;
  for (size_t i = 0; i < prompts.size(); ++i)
    seqs.push_back({&prompts[i], &responses[i]});
  std::vector<size_t> all(seqs.size());
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<float>> out(seqs.size());
  auto replicas = replicas_now();
  std::vector<int64_t> computed(replicas, 0);
  for_micro_batches(
      plan(seqs, all, replicas), replicas,
      [&](policy_model& model, const std::vector<size_t>& mb, size_t k) {
        auto logp = micro_batch_logprobs(model, seqs, mb, &computed[k]).to(at::kCPU).contiguous();
        auto data = logp.data_ptr<float>();
        size_t offset = 0;
        for (auto i : mb) {  // each sequence belongs to one micro-batch: no two threads write one entry
          auto n = seqs[i].response->size();
          out[i].assign(data + offset, data + offset + n);
          offset += n;
        }
      },
      false);
  return out;
}

bool trainer::apply_gradients(step_stats& stats) {
  at::NoGradGuard no_grad;
  auto& flat = model_.flat();
  auto& grad = model_.flat_grad();
  // On the CPU in float32 the step is one pass of cpu::adamw per thread of the pass
  // (ATen's composition below made about ten passes on one thread while the other cores idled).
  bool own_loop = fused::applies(flat) && grad.scalar_type() == at::kFloat && flat.is_contiguous() &&
                  grad.is_contiguous() && adam_m_.is_contiguous() && adam_v_.is_contiguous();
  auto parts = own_loop ? replicas_now() : size_t{1};
  double norm = 0;
  if (own_loop) {
    std::vector<double> squares(parts, 0.0);
    replica_threads_.run(parts, [&](size_t k) {
      auto [begin, end] = part_of(flat.numel(), k, parts);
      squares[k] = cpu::sum_of_squares(grad.data_ptr<float>(), begin, end);
    });
    for (auto s : squares)
      norm += s;
    norm = std::sqrt(norm);
  } else {
    norm = grad.to(at::kFloat).norm().item<double>();
  }
  stats.grad_norm = norm;
  stats.lr = learning_rate();
  if (!std::isfinite(norm) || !std::isfinite(stats.loss)) {
    stats.skipped = true;
    ++skipped_total_;
    if (++skipped_in_row_ >= config_.optimizer.max_nonfinite_in_row)
      throw training_error(std::to_string(skipped_in_row_) +
                           " optimizer steps in a row had a non-finite loss or "
                           "gradient (last: loss " +
                           std::to_string(stats.loss) + ", gradient norm " + std::to_string(norm) +
                           "); training stopped, the last checkpoint is intact. Lower the "
                           "learning rate or check the data.");
    grad.zero_();
    return false;
  }
  skipped_in_row_ = 0;
  auto& o = config_.optimizer;
  double scale = o.max_grad_norm > 0 && norm > o.max_grad_norm ? o.max_grad_norm / (norm + 1e-6) : 1.0;
  ++step_;
  auto bias1 = 1.0 - std::pow(o.beta1, static_cast<double>(step_));
  auto bias2 = 1.0 - std::pow(o.beta2, static_cast<double>(step_));
  if (own_loop) {
    cpu::adamw_step step{static_cast<float>(scale),    static_cast<float>(o.beta1),       static_cast<float>(o.beta2),
                         static_cast<float>(bias1),    static_cast<float>(bias2),         static_cast<float>(o.eps),
                         static_cast<float>(stats.lr), static_cast<float>(o.weight_decay)};
    replica_threads_.run(parts, [&](size_t k) {
      auto [begin, end] = part_of(flat.numel(), k, parts);
      cpu::adamw(flat.data_ptr<float>(), grad.data_ptr<float>(), adam_m_.data_ptr<float>(), adam_v_.data_ptr<float>(),
                 begin, end, step);
    });
    // Written through raw pointers: moved by hand, the version counter tells a decoding
    // model's packed weights (packed_weights.hpp) that these changed.
    flat.unsafeGetTensorImpl()->bump_version();
    stats.optimizer_steps++;
    return true;
  }
  auto g = grad.to(at::kFloat);
  if (scale != 1.0)
    g = g * scale;
  adam_m_.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  adam_v_.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  auto update = (adam_m_ / bias1) / ((adam_v_ / bias2).sqrt_().add_(o.eps));
  if (o.weight_decay > 0)
    update.add_(flat.to(at::kFloat), o.weight_decay);
  flat.sub_(update.mul_(stats.lr).to(flat.scalar_type()));
  grad.zero_();
  stats.optimizer_steps++;
  return true;
}

int64_t rl_sample::trained_tokens() const {
  return count_trained(response, loss_mask);
}

int64_t sft_sample::trained_tokens() const {
  return count_trained(response, loss_mask);
}

void trainer::check_batch(const std::vector<rl_sample>& batch) const {
  for (auto& s : batch) {
    if (s.behaviour_logprobs.size() != s.response.size())
      throw std::invalid_argument("a sample has " + std::to_string(s.response.size()) + " response tokens but " +
                                  std::to_string(s.behaviour_logprobs.size()) + " behaviour log-probabilities");
    if (!s.loss_mask.empty() && s.loss_mask.size() != s.response.size())
      throw std::invalid_argument("a sample has " + std::to_string(s.response.size()) +
                                  " response tokens but a loss mask of " + std::to_string(s.loss_mask.size()));
    if (s.prompt.empty() || s.response.empty())
      throw std::invalid_argument("a sample needs a non-empty prompt and response");
  }
}

double trainer::accumulate(const std::vector<rl_sample>& batch, const std::vector<std::vector<float>>& prox,
                           bool prox_is_this_pass, const std::vector<size_t>& members, step_stats& stats) {
  std::vector<sequence_ref> seqs;
  for (auto& s : batch)
    seqs.push_back({&s.prompt, &s.response});
  int64_t minibatch_tokens = 0;
  bool any_mask = false;
  for (auto i : members) {
    minibatch_tokens += batch[i].trained_tokens();
    any_mask = any_mask || !batch[i].loss_mask.empty();
  }
  minibatch_tokens = std::max<int64_t>(1, minibatch_tokens);
  // Per replica, merged after the pass.
  struct partial {
    double loss = 0, kl = 0;
    int64_t computed_tokens = 0, micro_batches = 0;
    ppo_token_stats ppo;
  };
  auto replicas = replicas_now();
  std::vector<partial> parts(replicas);
  for_micro_batches(
      plan(seqs, members, replicas), replicas,
      [&](policy_model& model, const std::vector<size_t>& mb, size_t k) {
        auto& part = parts[k];
        auto logp = micro_batch_logprobs(model, seqs, mb, &part.computed_tokens);
        std::vector<float> p, b, a, r;
        bool with_reference = config_.kl_coef > 0;
        for (auto i : mb) {
          if (!prox_is_this_pass)
            p.insert(p.end(), prox[i].begin(), prox[i].end());
          b.insert(b.end(), batch[i].behaviour_logprobs.begin(), batch[i].behaviour_logprobs.end());
          a.insert(a.end(), batch[i].response.size(), static_cast<float>(batch[i].advantage));
          with_reference = with_reference && batch[i].reference_logprobs.size() == batch[i].response.size();
          if (with_reference)
            r.insert(r.end(), batch[i].reference_logprobs.begin(), batch[i].reference_logprobs.end());
        }
        auto device = logp.device();
        auto mask = any_mask ? micro_batch_loss_mask(batch, mb, device) : at::Tensor{};
        auto prox_logp = prox_is_this_pass ? logp.detach() : at::tensor(p).to(device);
        auto losses = ppo_token_losses(logp, prox_logp, at::tensor(b).to(device), at::tensor(a).to(device), config_.ppo,
                                       &part.ppo, mask);
        if (with_reference) {
          auto kl = kl_penalty(logp, at::tensor(r).to(device), config_.kl);
          if (any_mask)
            kl = kl * mask;
          part.kl += kl.sum().item<double>();
          losses = losses + config_.kl_coef * kl;
        }
        // Divided by the minibatch's tokens, not the micro-batch's: the accumulated
        // gradient is then the gradient of the minibatch's token mean.
        auto loss = losses.sum() / static_cast<double>(minibatch_tokens);
        loss.backward();
        part.loss += loss.item<double>();
        part.micro_batches++;
      },
      true);
  double minibatch_loss = 0, minibatch_kl = 0;
  for (auto& part : parts) {
    minibatch_loss += part.loss;
    minibatch_kl += part.kl;
    stats.computed_tokens += part.computed_tokens;
    stats.micro_batches += part.micro_batches;
    stats.ppo.tokens += part.ppo.tokens;
    stats.ppo.clipped += part.ppo.clipped;
    stats.ppo.behaviour_masked += part.ppo.behaviour_masked;
    stats.ppo.importance_weight_sum += part.ppo.importance_weight_sum;
  }
  stats.kl = minibatch_kl / static_cast<double>(minibatch_tokens);
  stats.tokens += minibatch_tokens;
  return minibatch_loss;
}

std::vector<std::vector<float>> trainer::proximal_logprobs(const std::vector<rl_sample>& batch) {
  std::vector<size_t> all(batch.size());
  std::iota(all.begin(), all.end(), 0);
  return proximal_logprobs(batch, all);
}

std::vector<std::vector<float>> trainer::proximal_logprobs(const std::vector<rl_sample>& batch,
                                                           const std::vector<size_t>& members) {
  std::vector<std::vector<float>> prox(batch.size());
  if (members.empty())
    return prox;
  std::vector<std::vector<int32_t>> prompts, responses;
  for (auto i : members) {
    prompts.push_back(batch[i].prompt);
    responses.push_back(batch[i].response);
  }
  auto computed = response_logprobs(prompts, responses);
  for (size_t j = 0; j < members.size(); ++j)
    prox[members[j]] = std::move(computed[j]);
  return prox;
}

step_stats trainer::ppo_gradients(const std::vector<rl_sample>& batch) {
  check_batch(batch);
  step_stats stats;
  std::vector<size_t> all(batch.size());
  std::iota(all.begin(), all.end(), 0);
  stats.loss = accumulate(batch, {}, true, all, stats);
  return stats;
}

step_stats trainer::ppo_update(const std::vector<rl_sample>& batch) {
  auto start = std::chrono::steady_clock::now();
  step_stats stats;
  if (batch.empty())
    return stats;
  check_batch(batch);
  // Minibatches in a shuffled order, one optimizer step each.
  std::vector<size_t> order(batch.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng_);
  auto minibatches =
      std::max<int64_t>(1, std::min<int64_t>(config_.ppo_minibatches, static_cast<int64_t>(batch.size())));
  auto first_end = order.size() / static_cast<size_t>(minibatches);
  // pi_prox, the parameters before this update: one forward pass over the
  // minibatches after the first; the first one's own pass gives its pi_prox.
  auto prox = proximal_logprobs(batch, std::vector<size_t>(order.begin() + static_cast<long>(first_end), order.end()));
  double loss_total = 0;
  for (int64_t m = 0; m < minibatches; ++m) {
    auto begin = order.size() * static_cast<size_t>(m) / static_cast<size_t>(minibatches);
    auto end = order.size() * static_cast<size_t>(m + 1) / static_cast<size_t>(minibatches);
    std::vector<size_t> members(order.begin() + static_cast<long>(begin), order.begin() + static_cast<long>(end));
    stats.loss = accumulate(batch, prox, m == 0, members, stats);
    loss_total += stats.loss;
    apply_gradients(stats);
  }
  stats.loss = loss_total / static_cast<double>(minibatches);
  stats.seconds = seconds_since(start);
  return stats;
}

step_stats trainer::sft_update(const std::vector<sft_sample>& batch) {
  auto start = std::chrono::steady_clock::now();
  step_stats stats;
  std::vector<sequence_ref> seqs;
  int64_t total = 0;
  bool any_mask = false;
  for (auto& s : batch) {
    if (s.prompt.empty() || s.response.empty())
      throw std::invalid_argument("an SFT sample needs a non-empty prompt and response");
    if (!s.loss_mask.empty() && s.loss_mask.size() != s.response.size())
      throw std::invalid_argument("an SFT sample has " + std::to_string(s.response.size()) +
                                  " response tokens but a loss mask of " + std::to_string(s.loss_mask.size()));
    seqs.push_back({&s.prompt, &s.response});
    any_mask = any_mask || !s.loss_mask.empty();
    total += s.trained_tokens();
  }
  total = std::max<int64_t>(total, 1);
  std::vector<size_t> all(seqs.size());
  std::iota(all.begin(), all.end(), 0);
  // As a PPO pass: the micro-batches on the replicas at once, each replica's sums merged after.
  struct partial {
    double loss = 0;
    int64_t computed_tokens = 0, micro_batches = 0;
  };
  auto replicas = replicas_now();
  std::vector<partial> parts(replicas);
  for_micro_batches(
      plan(seqs, all, replicas), replicas,
      [&](policy_model& model, const std::vector<size_t>& mb, size_t k) {
        auto& part = parts[k];
        auto logp = micro_batch_logprobs(model, seqs, mb, &part.computed_tokens);
        if (any_mask)
          logp = logp * micro_batch_loss_mask(batch, mb, logp.device());
        auto loss = -logp.sum() / static_cast<double>(total);
        loss.backward();
        part.loss += loss.item<double>();
        part.micro_batches++;
      },
      true);
  for (auto& part : parts) {
    stats.loss += part.loss;
    stats.computed_tokens += part.computed_tokens;
    stats.micro_batches += part.micro_batches;
  }
  stats.tokens = total;
  apply_gradients(stats);
  stats.seconds = seconds_since(start);
  return stats;
}

}  // namespace areal::kernels
