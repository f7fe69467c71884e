// The trainer: decoupled PPO updates and SFT on the policy model, with
// dynamic padding-free micro-batching, AdamW on the flat parameter buffer,
// warmup + constant/cosine learning rate, global gradient-norm clipping,
// skipped non-finite steps, and atomic checkpoints that resume exactly.
//
// One PPO update on a batch: (1) proximal log-probabilities, one forward pass
// with the parameters before the update, over the minibatches after the first:
// the first minibatch's own forward pass runs on those same parameters, so its
// pi_prox is its pi_theta, detached (with ppo_minibatches = 1, the default, no
// separate pass runs at all); (2) the batch is split into
// `ppo_minibatches`; each is packed into micro-batches under
// max_tokens_per_mb, gradients accumulate over them with the loss divided by
// the minibatch's token count (so they equal the one-big-batch gradient), and
// one optimizer step follows. On CPU the micro-batches of a pass can run on
// several threads at once, each on its own copy of the parameters with one
// intra-op thread (data_parallel, or set_thread_count); their gradients are
// summed, equal to the serial ones up to rounding. On GPUs the replicas are one
// per device (replica_devices), each pass's gradients summed on the model's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "areal/kernels/advantages.hpp"
#include "areal/kernels/model.hpp"
#include "areal/kernels/ppo.hpp"
#include "areal/kernels/replica_threads.hpp"

namespace areal::kernels {

struct optimizer_config {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;
  std::string schedule = "constant";  // or "cosine"
  int64_t total_steps = 1000;         // for the cosine schedule
  double min_lr_ratio = 0.0;          // cosine floor, as a fraction of lr
  double max_grad_norm = 1.0;         // 0: no clipping
  int max_nonfinite_in_row = 3;       // then training stops with an error
};

struct trainer_config {
  optimizer_config optimizer;
  ppo_config ppo;
  int64_t ppo_minibatches = 1;
  int64_t max_tokens_per_mb = 4096;
  bool packed = true;  // false: fixed-size padded micro-batches (the ablation)
  /// Packed micro-batches compute a prompt that several of their samples share
  /// (a group's) once, each response attending to it (policy_model::forward's
  /// parents): the same log-probabilities and gradient up to rounding. false:
  /// every sample's prompt computed with it (the comparison).
  bool share_prompts = true;
  int64_t padded_mb_sequences = 8;  // sequences per padded micro-batch
  double temperature = 1.0;         // as used when sampling
  int64_t logprob_chunk_elements = int64_t{1} << 26;
  double kl_coef = 0.0;  // weight of KL(pi_theta || pi_ref) when reference log-probs are given
  kl_estimator kl = kl_estimator::k3;
  uint64_t seed = 1;  // minibatch shuffling
  /// PPO passes run their micro-batches on this many threads at once, each on
  /// its own copy of the parameters with one intra-op thread; gradients are
  /// summed (on CPU one thread per core is more efficient than intra-op threads
  /// on these small products). 1: one micro-batch at a time. Overridden by
  /// set_thread_count when that is set.
  int64_t data_parallel = 1;
  /// The devices of replicas 1, 2, ... (replica 0 is the model on its own
  /// device), "cuda:N" each: one replica per GPU, their gradients summed on the
  /// model's device. Set, the replicas are these whatever the thread count
  /// (entries "cpu" give CPU replicas, as tests use); empty: on the CPU one
  /// replica per thread, on a GPU the model alone.
  std::vector<std::string> replica_devices;
};

struct rl_sample {
  std::vector<int32_t> prompt;
  std::vector<int32_t> response;
  std::vector<float> behaviour_logprobs;  // one per response token
  double advantage = 0.0;                 // per sequence (outcome reward), given to each of its tokens
  std::vector<float> reference_logprobs;  // optional, for the KL term
  /// Empty (every response token is trained) or one per response token: 0 for
  /// the tool and template tokens of a multi-turn episode (context, not trained).
  std::vector<uint8_t> loss_mask;
  int64_t trained_tokens() const;
};

struct sft_sample {
  std::vector<int32_t> prompt;    // masked out of the loss
  std::vector<int32_t> response;  // trained on
  /// Empty (every response token is trained) or one per response token: 0 on
  /// the template and tool tokens between a transcript's assistant turns.
  std::vector<uint8_t> loss_mask;
  int64_t trained_tokens() const;
};

struct step_stats {
  double loss = 0;
  double grad_norm = 0;
  double kl = 0;
  double lr = 0;
  bool skipped = false;         // non-finite loss or gradient: no update
  int64_t tokens = 0;           // trained (response) tokens
  int64_t computed_tokens = 0;  // tokens run through the model, padding included
  int64_t micro_batches = 0;
  int64_t optimizer_steps = 0;
  ppo_token_stats ppo;
  double seconds = 0;
};

/// Raised when training cannot go on (repeated non-finite steps, unreadable checkpoint).
struct training_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class trainer {
 public:
  trainer(policy_model& model, trainer_config config);

  /// Log-probabilities of each sample's response tokens under the current parameters.
  std::vector<std::vector<float>> response_logprobs(const std::vector<std::vector<int32_t>>& prompts,
                                                    const std::vector<std::vector<int32_t>>& responses);
  /// One decoupled-PPO update (ppo_minibatches optimizer steps).
  step_stats ppo_update(const std::vector<rl_sample>& batch);
  /// The gradient of the whole batch as one minibatch, left in model.flat().grad(); no step.
  step_stats ppo_gradients(const std::vector<rl_sample>& batch);
  /// pi_prox of each sample's response tokens: the current parameters, no gradient.
  std::vector<std::vector<float>> proximal_logprobs(const std::vector<rl_sample>& batch);
  /// One supervised step: cross-entropy on response tokens (prompt masked), token mean.
  step_stats sft_update(const std::vector<sft_sample>& batch);

  /// Weights (Hugging Face layout, loadable by the engine), optimizer state, counters, RNG,
  /// plus `extra_files` (name -> contents, e.g. the controller's state of the same step).
  /// Atomic: a crash mid-write leaves the previous checkpoint usable.
  void save_checkpoint(const std::string& directory, const std::map<std::string, std::string>& extra_files = {}) const;
  /// What save_checkpoint writes, copied into host memory: the trainer may go on
  /// training while another thread writes it (write_checkpoint).
  struct checkpoint_snapshot;
  std::shared_ptr<const checkpoint_snapshot> snapshot_checkpoint(
      const std::map<std::string, std::string>& extra_files = {}) const;
  /// Writes a snapshot as save_checkpoint does (atomic, durable when it returns);
  /// touches no trainer, so any thread may run it. Throws training_error.
  static void write_checkpoint(const std::string& directory, const checkpoint_snapshot& snapshot);
  /// The policy version a snapshot holds.
  static int64_t snapshot_version(const checkpoint_snapshot& snapshot);
  /// The directory holding the complete checkpoint saved as `directory` (it is
  /// directory.old when a process died between the two renames of a save), or
  /// empty when there is none.
  static std::string complete_checkpoint(const std::string& directory);
  /// The policy version a complete checkpoint directory holds (its trainer_state.json); throws training_error.
  static int64_t checkpoint_version(const std::string& directory);
  /// Restores everything save_checkpoint wrote; a following update continues exactly.
  void load_checkpoint(const std::string& directory);

  int64_t optimizer_step() const { return step_; }
  int64_t policy_version() const { return version_; }
  void set_policy_version(int64_t v) { version_ = v; }
  int64_t skipped_steps() const { return skipped_total_; }
  double learning_rate() const;
  const trainer_config& config() const { return config_; }
  /// Asked before every PPO pass (the proximal pass, each minibatch) how many
  /// threads it may use, which become data-parallel replicas (a node whose cores
  /// are shared between training and generation changes it as the other side
  /// becomes busy or idle). Unset: config().data_parallel.
  void set_thread_count(std::function<int()> threads) { thread_count_ = std::move(threads); }
  /// The data-parallel replicas a pass runs on now (the model's own included).
  size_t replica_count() const { return replicas_now(); }
  /// Seconds the replicas' parts of all passes so far waited for a pass's last
  /// part (replica_threads::waited_seconds): the lockstep's cost; take differences.
  double replicas_waited_seconds() const { return replica_threads_.waited_seconds(); }

 private:
  struct sequence_ref {
    const std::vector<int32_t>* prompt;
    const std::vector<int32_t>* response;
  };
  // Response-token log-probs of one micro-batch under `model`'s parameters (differentiable when grad is on).
  at::Tensor micro_batch_logprobs(policy_model& model, const std::vector<sequence_ref>& seqs,
                                  const std::vector<size_t>& members, int64_t* computed_tokens);
  // Replicas for a pass now (1 = the model alone, on the calling thread's settings).
  size_t replicas_now() const;
  // Runs work(model, micro_batch, replica index) for every micro-batch, spread
  // over `replicas` threads, replica 0 being model_ on the calling thread and the
  // others fresh copies of its parameters. Exceptions reach the caller.
  void for_micro_batches(const std::vector<std::vector<size_t>>& micro_batches, size_t replicas,
                         const std::function<void(policy_model&, const std::vector<size_t>&, size_t)>& work,
                         bool with_grad);
  std::vector<std::vector<size_t>> plan(const std::vector<sequence_ref>& seqs, const std::vector<size_t>& members,
                                        size_t min_micro_batches = 1) const;
  void check_batch(const std::vector<rl_sample>& batch) const;
  // Accumulates the gradient of the members' token-mean loss; returns that loss.
  // `prox` holds pi_prox per sample; when `prox_is_this_pass`, the parameters have
  // not moved since pi_prox was due, and the pass's own log-probabilities
  // (detached) are pi_prox: `prox` is not read.
  double accumulate(const std::vector<rl_sample>& batch, const std::vector<std::vector<float>>& prox,
                    bool prox_is_this_pass, const std::vector<size_t>& members, step_stats& stats);
  // pi_prox of the `members` samples (other entries left empty).
  std::vector<std::vector<float>> proximal_logprobs(const std::vector<rl_sample>& batch,
                                                    const std::vector<size_t>& members);
  // Clip, check, AdamW; returns false when the step was skipped.
  bool apply_gradients(step_stats& stats);

  policy_model& model_;
  trainer_config config_;
  at::Tensor adam_m_, adam_v_;
  int64_t step_ = 0;
  int64_t version_ = 0;
  int64_t skipped_total_ = 0;
  int skipped_in_row_ = 0;
  std::mt19937_64 rng_;
  std::function<int()> thread_count_;
  // Parameter copies for data-parallel passes: each copied when the model's
  // weights have changed since (the tensor's version counter; a step's proximal
  // pass and its minibatches share one copy), its gradient left zero by the sum
  // that reads it.
  struct replica_copy {
    std::unique_ptr<policy_model> model;
    int64_t weights_version = -1;
    bool grad_zero = false;
  };
  std::vector<at::Device> replica_devices_;  // config_.replica_devices, read
  std::vector<replica_copy> replicas_;
  replica_threads replica_threads_;  // the threads replicas 1.. run on
};

}  // namespace areal::kernels
