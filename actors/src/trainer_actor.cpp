// The trainer actor's behaviour: group advantages, one decoupled-PPO update per
// batch, and a snapshot of the new weights for the rollout workers.
#include "areal/actors/trainer_actor.hpp"
#include "areal/actors/exception_guard.hpp"
#include "areal/actors/weight_transport.hpp"
#include "areal/kernels/compute_threads.hpp"

#include "areal/actors/run_checkpoint.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include <caf/all.hpp>

namespace areal {

namespace {

struct trainer_state {
  static inline const char* name = "areal.trainer";
  trainer_setup setup;
  std::unique_ptr<kernels::trainer> trainer;
  std::unique_ptr<kernels::trainer> reference;  // log-probabilities of pi_ref only (KL), never stepped
  std::shared_ptr<const at::Tensor> snapshot;   // weights of the current version, never modified
  bool busy = false;                            // counted as busy in the compute share
  std::string broken;                           // why the trainer cannot work (a checkpoint failed to load)
  // The checkpoint being written on a thread of its own, while the trainer goes on.
  struct checkpoint_writer {
    std::thread thread;
    bool writing = false;
    int64_t version = -1;                                       // of the last checkpoint asked for
    std::string error;                                          // why its write failed ("" when it did not)
    std::vector<caf::typed_response_promise<int64_t>> waiting;  // asked when it is on disk
    ~checkpoint_writer() {
      if (thread.joinable())
        thread.join();
    }
  } writer;
};

using trainer_pointer = trainer_actor::stateful_pointer<trainer_state>;

local_weights current_weights(trainer_pointer self) {
  auto& st = self->state;
  if (!st.snapshot) {
    tracer::scope span{st.setup.trace.get(), "trainer", "weight sync"};
    // Without a publisher every reader is in this process (the rollout workers,
    // the evaluator) and copies the snapshot into a model of its own: it stays
    // on the model's device, so that on GPUs the version moves device to device
    // (no round trip through the host), at the cost of a second copy of the
    // weights there. With one, where its links read it: on the model's GPU
    // for NCCL links, else in host memory (an engine copies it onto its own
    // device).
    auto& flat = st.setup.model->flat();
    auto device = st.setup.publisher ? st.setup.publish_device : flat.device().str();
    st.snapshot = publishable_copy(st.trainer->policy_version(), flat, device).flat;
  }
  return {st.trainer->policy_version(), st.snapshot};
}

// Advantages per group (the samples of one prompt) from shaped rewards. The
// trajectories of one sample (an agent's episode split where its client
// rewrote the history) share its reward and advantage, and count once.
std::vector<kernels::rl_sample> to_samples(trainer_pointer self, const std::vector<trajectory>& trajectories,
                                           train_report& report) {
  auto& st = self->state;
  std::map<uint64_t, std::map<uint32_t, std::vector<size_t>>> groups;
  for (size_t i = 0; i < trajectories.size(); ++i)
    groups[trajectories[i].group_id][trajectories[i].sample_index].push_back(i);
  std::vector<kernels::rl_sample> samples(trajectories.size());
  int64_t oldest = st.trainer->policy_version();
  size_t counted = 0;
  for (auto& [group, by_index] : groups) {
    std::vector<double> rewards;
    for (auto& [index, members] : by_index) {
      int64_t generated = 0;
      for (auto i : members)
        generated += trajectories[i].generated_tokens();
      auto& t = trajectories[members.front()];
      rewards.push_back(kernels::shape_reward(t.reward, generated, st.setup.shaping));
      report.reward_mean += t.reward;
      ++counted;
    }
    auto advantages = kernels::group_advantages(rewards, st.setup.estimator);
    size_t k = 0;
    for (auto& [index, members] : by_index) {
      for (auto i : members) {
        auto& t = trajectories[i];
        auto& sample = samples[i];
        sample.prompt = t.prompt_tokens;
        sample.response = t.output_tokens;
        sample.behaviour_logprobs = t.behaviour_logprobs;
        sample.loss_mask = t.loss_mask;
        sample.advantage = advantages[k];
        for (auto v : t.token_versions)
          oldest = std::min(oldest, v);
      }
      ++k;
    }
  }
  report.reward_mean /= static_cast<double>(std::max<size_t>(1, counted));
  report.max_staleness = st.trainer->policy_version() - oldest;
  // Responses with no generated token carry nothing to train on.
  samples.erase(std::remove_if(samples.begin(), samples.end(), [](auto& x) { return x.trained_tokens() == 0; }),
                samples.end());
  return samples;
}

// The new version goes out: through the publisher (its reports to `report_to`:
// each node's as it comes, and all of them once the version settles), or
// straight to the rollout workers of this process.
void publish(trainer_pointer self, const local_weights& weights, caf::actor report_to) {
  auto& st = self->state;
  if (!st.setup.publisher) {
    for (auto& r : st.setup.rollouts)
      self->send(r, weights);
    return;
  }
  self->request(st.setup.publisher, st.setup.publish_timeout, publish_atom::value, weights, report_to)
      .then(
          [report_to](std::vector<weight_delivery>& reports) {
            if (report_to)
              caf::anon_send(report_to, std::move(reports));
          },
          [report_to, version = weights.version](caf::error& err) {
            weight_delivery failed;
            failed.subscriber = "(all)";
            failed.version = version;
            failed.error = "publishing failed: " + describe(err);
            if (report_to)
              caf::anon_send(report_to, std::vector<weight_delivery>{failed});
          });
}

caf::result<train_report> train(trainer_pointer self, const std::vector<trajectory>& trajectories) {
  auto& st = self->state;
  train_report report;
  auto samples = to_samples(self, trajectories, report);
  kernels::step_stats stats;
  if (st.setup.share)
    st.setup.share->set_busy(st.busy, true);
  try {
    tracer::scope span{st.setup.trace.get(), "trainer", "train"};
    span.count_thread_cpu();           // the first replica's thread: what it computed of the step
    int64_t tokens = 0, attended = 0;  // what the step computes, as the simulator's cost model counts it
    for (auto& s : samples) {
      auto n = static_cast<int64_t>(s.prompt.size() + s.response.size());
      tokens += n;
      attended += n * (n + 1) / 2;
    }
    span.args = {{"sequences", static_cast<int64_t>(samples.size())}, {"tokens", tokens}, {"attended", attended}};
    if (!st.setup.share)
      kernels::set_compute_threads(st.setup.compute_threads);
    if (st.reference) {
      std::vector<std::vector<int32_t>> prompts, responses;
      for (auto& s : samples) {
        prompts.push_back(s.prompt);
        responses.push_back(s.response);
      }
      auto ref = st.reference->response_logprobs(prompts, responses);
      for (size_t i = 0; i < samples.size(); ++i)
        samples[i].reference_logprobs = std::move(ref[i]);
    }
    auto waited = st.trainer->replicas_waited_seconds();
    stats = st.trainer->ppo_update(samples);
    // The replicas' parts waiting for one another in this step (their lockstep), summed over replicas.
    span.args.emplace_back("replicas_waited_us",
                           static_cast<int64_t>((st.trainer->replicas_waited_seconds() - waited) * 1e6));
  } catch (const std::exception& e) {
    if (st.setup.share)
      st.setup.share->set_busy(st.busy, false);
    return caf::make_error(caf::sec::runtime_error, std::string{"trainer: "} + e.what());
  }
  if (st.setup.share)
    st.setup.share->set_between_steps(st.busy);  // its next batch is usually on its way
  st.trainer->set_policy_version(st.trainer->policy_version() + 1);
  st.snapshot.reset();
  report.version = st.trainer->policy_version();
  report.loss = stats.loss;
  report.grad_norm = stats.grad_norm;
  report.kl = stats.kl;
  report.lr = stats.lr;
  report.samples = static_cast<int64_t>(trajectories.size());
  report.tokens = stats.tokens;
  report.behaviour_masked = stats.ppo.behaviour_masked;
  report.seconds = stats.seconds;
  auto publish_start = std::chrono::steady_clock::now();
  auto weights = current_weights(self);
  report.publish_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - publish_start).count();
  publish(self, weights, caf::actor_cast<caf::actor>(self->current_sender()));
  return report;
}

}  // namespace

trainer_actor spawn_trainer(caf::actor_system& sys, trainer_setup setup) {
  return sys.spawn<caf::detached>(
      [setup = std::move(setup)](trainer_pointer self) mutable -> trainer_actor::behavior_type {
        guard_exceptions(self, "trainer");
        auto& st = self->state;
        st.setup = std::move(setup);
        st.trainer = std::make_unique<kernels::trainer>(*st.setup.model, st.setup.config);
        if (auto share = st.setup.share)
          st.trainer->set_thread_count([share] { return share->training_threads(); });
        if (st.setup.reference && st.setup.config.kl_coef > 0) {
          st.setup.reference->set_trainable(false);
          st.reference = std::make_unique<kernels::trainer>(*st.setup.reference, st.setup.config);
          if (auto share = st.setup.share)
            st.reference->set_thread_count([share] { return share->training_threads(); });
        }
        st.trainer->set_policy_version(st.setup.initial_version);
        if (!st.setup.resume_from.empty()) {
          try {
            st.trainer->load_checkpoint(st.setup.resume_from);
          } catch (const std::exception& e) {
            st.broken = e.what();  // every request is answered with it
          }
        }
        return {
            [self](train_atom, local_batch& batch) -> caf::result<train_report> {
              if (!self->state.broken.empty())
                return caf::make_error(caf::sec::runtime_error, "trainer: " + self->state.broken);
              if (!batch.trajectories)
                return caf::make_error(caf::sec::invalid_argument, "trainer: an empty batch");
              return train(self, *batch.trajectories);
            },
            [self](eval_atom) -> caf::result<int64_t, double, double> {
              auto& s = self->state;
              if (!s.setup.evaluator)
                return caf::make_error(caf::sec::invalid_argument, "trainer: no evaluator in this run");
              return self->delegate(s.setup.evaluator, eval_atom::value, current_weights(self));
            },
            [self](weights_atom) -> caf::result<local_weights> {
              if (!self->state.broken.empty())
                return caf::make_error(caf::sec::runtime_error, "trainer: " + self->state.broken);
              return current_weights(self);
            },
            [self](checkpoint_atom, std::string& directory, std::string& controller_state) -> caf::result<int64_t> {
              auto& s = self->state;
              auto& w = s.writer;
              if (w.writing)
                return caf::make_error(caf::sec::runtime_error,
                                       "trainer: the checkpoint of version " + std::to_string(w.version) +
                                           " is still being written; ask for it to be durable first");
              std::shared_ptr<const kernels::trainer::checkpoint_snapshot> snapshot;
              try {
                tracer::scope span{s.setup.trace.get(), "trainer", "checkpoint"};
                std::map<std::string, std::string> files{{controller_checkpoint::file_name, controller_state}};
                if (!s.setup.tokenizer_json.empty())
                  files["model/tokenizer.json"] = s.setup.tokenizer_json;
                snapshot = s.trainer->snapshot_checkpoint(files);
              } catch (const std::exception& e) {
                return caf::make_error(caf::sec::runtime_error,
                                       "trainer: cannot save the checkpoint in " + directory + ": " + e.what());
              }
              if (w.thread.joinable())
                w.thread.join();  // the last write, already ended
              w.writing = true;
              w.version = kernels::trainer::snapshot_version(*snapshot);
              w.error.clear();
              trainer_actor me = self;
              w.thread = std::thread([me, snapshot, directory, trace = s.setup.trace, version = w.version] {
                std::string error;
                try {
                  tracer::scope span{trace.get(), "checkpoint writer", "checkpoint write"};
                  kernels::trainer::write_checkpoint(directory, *snapshot);
                } catch (const std::exception& e) {
                  error = "trainer: cannot save the checkpoint in " + directory + ": " + e.what();
                }
                caf::anon_send(me, durable_atom::value, version, std::move(error));
              });
              return w.version;
            },
            [self](durable_atom) -> caf::result<int64_t> {
              auto& w = self->state.writer;
              if (w.writing) {
                w.waiting.push_back(self->make_response_promise<int64_t>());
                return w.waiting.back();
              }
              if (!w.error.empty())
                return caf::make_error(caf::sec::runtime_error, w.error);
              return w.version;
            },
            [self](durable_atom, int64_t version, std::string& error) {
              auto& w = self->state.writer;
              if (!w.writing || version != w.version)
                return;  // not from this trainer's writer
              w.writing = false;
              w.error = error;
              for (auto& promise : w.waiting) {
                if (error.empty())
                  promise.deliver(version);
                else
                  promise.deliver(caf::make_error(caf::sec::runtime_error, error));
              }
              w.waiting.clear();
            },
        };
      });
}

}  // namespace areal
