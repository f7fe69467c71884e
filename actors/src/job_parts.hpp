// The parts of an RL job that the controller's node and the other nodes
// share: the data sources, the model and its tokenizer, the held-out set, the
// rollout workers, the warm start, the progress line and the run's outputs.
// Internal to actors/.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <nlohmann/json_fwd.hpp>

#include "areal/actors/compute_share.hpp"
#include "areal/actors/endpoint.hpp"
#include "areal/actors/evaluator.hpp"
#include "areal/actors/interfaces.hpp"
#include "areal/actors/rl_job.hpp"
#include "areal/actors/run_checkpoint.hpp"
#include "areal/actors/run_kernels.hpp"
#include "areal/actors/weight_transport.hpp"
#include "areal/kernels/chat_template.hpp"
#include "areal/kernels/engine.hpp"
#include "areal/kernels/model.hpp"
#include "areal/kernels/model_config.hpp"
#include "areal/kernels/tokenizer.hpp"
#include "areal/kernels/trainer.hpp"
#include "areal/runtime/config.hpp"
#include "areal/runtime/trace.hpp"
#include "areal/tasks/tasks.hpp"

namespace areal::job {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// Why the job cannot start; the text says what to do.
struct job_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Disjoint random streams of one seed: 1 RL prompts, 2 SFT demonstrations,
/// 3 held-out prompts, 4 model initialization, 5 SFT, 6 RL trainer, 7 samples.
uint64_t stream_seed(uint64_t seed, uint64_t stream);

/// A JSONL task's datasets, read once (job_inputs.cpp); empty for generated tasks.
struct job_datasets {
  std::vector<tasks::task_item> train;           // usable tasks of task.train_path, in file order
  std::vector<tasks::task_item> eval;            // usable tasks of task.eval_path
  size_t held_out = 0;                           // the first tasks of `train` held out (no task.eval_path)
  std::vector<tasks::task_item> demonstrations;  // training tasks with a solution that fits the context
  std::vector<std::string> notes;                // what the data holds
  std::vector<std::string> warnings;             // what was skipped and why, what looks wrong
};

struct model_parts {
  std::shared_ptr<const kernels::tokenizer> tokenizer;
  kernels::model_config config;
  std::shared_ptr<kernels::policy_model> policy;
  int32_t eos = 0;
  std::shared_ptr<const job_datasets> data;
};

/// Reads task.train_path and task.eval_path (JSONL tasks); throws job_error naming the file and line.
job_datasets read_datasets(const run_config& c);
/// The characters of every prompt and solution (a character-level tokenizer's alphabet).
std::string data_alphabet(const run_config& c, const job_datasets& d);
/// Cross-checks of the settings, the model, its tokenizer and the data before
/// any work: tasks that cannot fit the context are skipped (noted), the
/// held-out split and the demonstrations are made; throws job_error saying what to change.
void check_inputs(const run_config& c, const model_parts& m, job_datasets& d);

std::unique_ptr<tasks::task_source> training_source(const run_config& c, const model_parts& m);
std::unique_ptr<tasks::task_source> demonstration_source(const run_config& c, const model_parts& m);
std::vector<tasks::task_item> held_out_items(const run_config& c, const model_parts& m);

/// Where a node computes: its `devices`, or else model.device alone.
std::vector<std::string> node_devices(const run_config& c, const node_spec& self);
/// The devices of a trainer's replicas besides its model's (the first of
/// `devices`): the other GPUs. None on the CPU, whose replicas are its threads.
std::vector<std::string> replica_devices(const std::vector<std::string>& devices);

/// The configured model (model.path, or a preset initialized from the seed),
/// on the first of the node's devices, its tokenizer and the checked data
/// (check_inputs); throws job_error.
model_parts make_model(const run_config& c, const node_spec& self);
/// The held-out prompts (eval.prompts of them).
std::shared_ptr<eval_set> make_eval_set(const run_config& c, const model_parts& m);
std::string by_difficulty_text(const eval_result& r);

/// The model's chat template: ChatML from the model directory, or the presets'
/// compact ChatML; throws kernels::template_error saying why there is none.
std::shared_ptr<const kernels::chat_template> model_chat_template(const run_config& c, const model_parts& m);
/// The endpoint's API key (endpoint.api_key_file; empty: none); throws job_error.
std::string endpoint_api_key(const run_config& c);
/// The endpoint of this node (its http_port): the rollout workers, the
/// controller and store for episodes, the model's chat template; throws
/// job_error (an unreadable API key file, a port in use).
std::unique_ptr<http_endpoint> start_endpoint(caf::actor_system& sys, const run_config& c, const node_spec& self,
                                              const model_parts& m, const std::vector<rollout_actor>& rollouts,
                                              controller_actor controller, sample_store_actor store);
/// rl.rollout_workers workers, worker i's model on the node's devices[i mod their count].
std::vector<rollout_actor> spawn_rollout_workers(caf::actor_system& sys, const run_config& c, const model_parts& m,
                                                 const node_spec& self, std::shared_ptr<compute_share> share,
                                                 std::shared_ptr<tracer> trace, int64_t initial_version,
                                                 const std::string& prefix);

/// The weight subscription of this node's rollout workers to a (remote) publisher.
weight_subscriber_setup rollout_subscription(const run_config& c, const node_spec& self, caf::actor publisher,
                                             const std::vector<rollout_actor>& rollouts, uint64_t model_bytes);

std::string duration_text(double seconds);

/// One live line on a terminal (redrawn), or a line every 10 s in a log.
class progress_line {
 public:
  explicit progress_line(bool enabled);
  void show(const std::string& text);
  void close();

 private:
  bool enabled_, tty_, open_ = false;
  clock_type::time_point last_ = clock_type::now();
};

/// The RL phase's start, for the progress line's speed and ETA.
struct progress_origin {
  clock_type::time_point at;
  int64_t steps = 0, trained = 0;  // the controller's counters then
};
/// The progress line's text: the step, samples/s since `origin`, the last reward, the staleness and the ETA.
std::string progress_text(const controller_stats& s, int64_t total_steps, const progress_origin& origin);

/// The KL anchor: the policy RL started from (the warm-started model kept in
/// the run directory when resuming, else a copy of the policy now).
std::shared_ptr<kernels::policy_model> reference_policy(const std::filesystem::path& run_dir, bool resumed,
                                                        const model_parts& m);

/// How the evaluator and the final evaluation decode (greedy, rl.max_new_tokens, the run's verifiers).
eval_options make_eval_options(const run_config& c, const model_parts& m);

/// The actors on the node with the trainer role.
struct trainer_side {
  trainer_actor trainer;
  sample_store_actor store;
  weight_publisher_actor publisher;    // when other nodes take the weights
  evaluator_actor evaluator;           // when there are held-out prompts
  weight_subscriber_actor subscriber;  // a remote trainer's weights for this node's rollout workers
};

struct trainer_side_setup {
  int64_t initial_version = 0;
  std::string resume_from;  // a checkpoint directory the trainer loads first
  std::filesystem::path run_dir;
  bool publish = false;                 // a weight publisher for other nodes (multi-node runs)
  node_spec node;                       // this node (the publisher's name and host)
  std::vector<rollout_actor> rollouts;  // in this process: subscribed to the publisher, or sent weights directly
  std::shared_ptr<eval_set> evals;      // optional: held-out prompts for the evaluator
  std::shared_ptr<compute_share> share;
  std::shared_ptr<tracer> trace;
};

/// Spawns the trainer side over m.policy (which the trainer owns from now on).
trainer_side spawn_trainer_side(caf::actor_system& sys, const run_config& c, const model_parts& m,
                                const trainer_side_setup& s);
void stop_trainer_side(const trainer_side& side);

/// The controller node's half of a trainer on a node of its own: saves the
/// weights the run starts from (unless it resumes), asks the node actor for the
/// trainer side (answered once the trainer's node joined, within
/// cluster.connect_timeout_s, or `wait_s` when given), and subscribes this
/// node's rollout workers to its publisher. Throws job_error with the reason.
trainer_side remote_trainer_side(caf::actor_system& sys, const run_config& c, node_actor node, const node_spec& self,
                                 const std::filesystem::path& run_dir, const model_parts& m,
                                 const std::string& resume_from, int64_t initial_version,
                                 const std::vector<rollout_actor>& rollouts, double wait_s = -1);
/// A trainer on a node of its own was lost (`why`): waits up to
/// cluster.trainer_rejoin_s for its node to join again and has it start from
/// the last complete checkpoint; the trainer side and that checkpoint's
/// controller record. Throws job_error with the reason (no checkpoint yet, no
/// trainer in time).
std::pair<trainer_side, controller_checkpoint> rejoined_trainer_side(caf::actor_system& sys, const run_config& c,
                                                                     node_actor node, const node_spec& self,
                                                                     const std::filesystem::path& run_dir,
                                                                     const model_parts& m,
                                                                     const std::vector<rollout_actor>& rollouts,
                                                                     const std::string& why);
/// An evaluation outside the controller's steps (before RL, or of the final
/// weights) as a metrics line; `time_s` is the run's time then (the report
/// draws accuracy against it).
void eval_line(const std::filesystem::path& run_dir, const char* which, double time_s, int64_t version, double accuracy,
               double mean_tokens, int64_t prompts = -1);
/// The accuracy of the evaluation before RL that metrics.jsonl records (a
/// resumed run's own start), if it has one over the same number of held-out prompts.
std::optional<double> recorded_accuracy_before(const std::filesystem::path& run_dir, int64_t prompts);
/// The held-out accuracy of the final weights (into result.accuracy_after and
/// metrics.jsonl): here with the trainer's weights by pointer, or by the
/// evaluator beside a remote trainer.
void evaluate_final(caf::scoped_actor& self, const trainer_side& side, bool remote, const model_parts& m,
                    const eval_set& evals, const eval_options& eo, const std::filesystem::path& run_dir, double time_s,
                    rl_job_result& result);
/// The controller's record of a checkpoint agrees with the trainer's state
/// beside it and with this run; throws job_error otherwise.
void check_resume_state(const controller_checkpoint& saved, const std::string& dir, const run_config& c);
/// The trainer node's half: the trainer side over the configured model with the
/// weights of `model_dir`.
trainer_side start_trainer_side(caf::actor_system& sys, const run_config& c, const node_spec& self,
                                const std::string& model_dir, const std::string& resume_from, int64_t initial_version,
                                const std::string& run_dir, std::shared_ptr<tracer> trace);

/// The endpoint's counts for summary.json (logged as one line).
nlohmann::json endpoint_summary(const http_endpoint& endpoint);
/// The other nodes' trace spans (asked of the node actor), in this node's clock, onto `trace`.
void merge_node_traces(caf::scoped_actor& self, const node_actor& node, tracer& trace);
/// The run's outputs (trace.json, summary.json) and its last lines: each file
/// written whole or not at all; one that fails makes a clean run exit 1.
void write_outputs(const std::filesystem::path& run_dir, const rl_spec& rl, const nlohmann::json& endpoint_record,
                   const tracer& trace, rl_job_result& result);

/// The supervised warm start (sft.*) of m.policy on `threads` cores (one model
/// replica each) or, on GPUs, one replica on each of the node's devices; false
/// when `stop` was set meanwhile.
/// `transcripts`: an agent run's chat demonstrations (else the task's own).
bool warm_start(const run_config& c, model_parts& m, int threads, const node_spec& self, const std::atomic<bool>& stop,
                progress_line& progress, const std::vector<kernels::sft_sample>& transcripts = {});

}  // namespace areal::job
