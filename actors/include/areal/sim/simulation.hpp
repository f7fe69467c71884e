// Virtual-time runs of the real controller. The controller, its staleness
// gate, prompt stream, group buffer and sample ledger are the ones production
// runs use; CAF's deterministic test scheduler runs them, and its clock jumps
// from one timed event to the next. The members around it are simulated
// (sim_members.hpp): rollout engines with continuous batching, a reward pool
// of parallel scorers, a sample store with the trainer behind it, weight
// transfers; their costs come from a cost_model, the lengths of what they
// generate from a workload. The same setup and seed give the same schedule
// log, byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "areal/sim/cost_model.hpp"
#include "areal/sim/workload.hpp"

namespace areal::sim {

/// What a rollout engine does with new weights while sequences are in flight.
enum class interruption {
  reprefill,  // take them at the next step: the caches of the sequences in flight are recomputed
  wait,       // take them once the sequences in flight are done, admitting none meanwhile
};

struct sim_setup {
  std::shared_ptr<const cost_model> costs;
  workload work;
  int64_t devices = 128;           // all devices of the run
  double generation_share = 0.75;  // of them generating (decoupled runs); the rest train
  /// The synchronous baseline of the paper's peers: every device generates the
  /// batch, then every device trains on it (eta must be 0).
  bool colocated = false;
  int64_t eta = 8;              // staleness bound; -1: unbounded
  int64_t batch_prompts = 512;  // prompts per training step
  int64_t group_size = 16;      // answers per prompt
  int64_t steps = 100;          // training steps
  int64_t engine_slots = 0;     // sequences one engine holds at once (0: what its KV cache fits)
  int64_t max_concurrent = 0;   // requests in flight over all engines (0: all their slots)
  interruption on_weights = interruption::reprefill;
  /// The answers of a group on one engine share their prompt's cache: it is
  /// computed once (as the real engine's prompt pool, and GPU engines' prefix caches, do).
  bool shared_prompts = true;
  /// CPU cores that every rollout engine and the trainer share, each computing
  /// on one thread (one-thread processes on one machine, as a multi-process run
  /// on a laptop): while k of them compute at once, each runs at min(1, cores / k)
  /// of its speed alone, the equal shares the kernel's scheduler gives runnable
  /// threads. The costs are then each side's alone on one thread. 0: devices of
  /// their own (or the cost model's when_sharing()).
  int64_t shared_cores = 0;
  bool keep_log = true;  // the schedule log (admissions, dispatches, completions, versions)
  /// Checks the setup; throws std::invalid_argument saying what is wrong and what to do.
  void check() const;
  int64_t engines() const;
  int64_t trainer_devices() const;
  /// How many times slower than alone a member computes while `computing` members
  /// (engines and the trainer) compute at once: 1 unless shared_cores is set.
  double slowdown(int64_t computing) const;
  /// Sequences one engine holds at once.
  int64_t slots_per_engine() const;
};

struct step_point {
  int64_t version = 0;
  double seconds = 0;  // virtual time the step's report reached the controller
  int64_t samples = 0, tokens = 0;
  int64_t max_staleness = 0;
};

struct sim_result {
  int32_t exit_code = 0;
  std::string end_reason;
  double virtual_seconds = 0;  // from the start to the last step's report
  int64_t steps = 0, trained_samples = 0;
  int64_t trained_tokens = 0;    // prompt + response tokens of the trained samples
  int64_t generated_tokens = 0;  // response tokens generated (all, trained or not)
  // Of the generated tokens, those in trained samples (the rest: dropped, or in flight at the end).
  int64_t trained_response_tokens = 0;
  // Scored samples the controller dropped (staler than the bound when their batch formed); the
  // in-flight ones at the run's end are not counted.
  int64_t dropped_samples = 0;
  int64_t interruptions = 0;     // sequences whose cache was recomputed after new weights
  int64_t prefill_tokens = 0;    // tokens the engines' prefills computed (re-prefills included)
  int64_t max_staleness = 0;     // over the trained batches, in versions
  double engine_busy_share = 0;  // share of engine time spent in steps (decode and prefill)
  double reprefill_share = 0;    // share of engine time spent recomputing interrupted caches
  double trainer_busy_share = 0;
  int64_t events = 0;              // messages the scheduler ran
  double wall_seconds = 0;         // real time the simulation took
  double member_wall_seconds = 0;  // of it, in the simulated members' handlers (the rest: the
                                   // controller, its link actors and the message passing)
  std::vector<step_point> trained;
  std::string schedule_log;    // one line per event (keep_log)
  uint64_t schedule_hash = 0;  // FNV-1a of the log (also without keep_log)

  double trained_tokens_per_second() const { return virtual_seconds > 0 ? trained_tokens / virtual_seconds : 0; }
  /// The rate once the pipeline is full: trained tokens of the second half of
  /// the steps over the time they took (a run of hundreds of steps, as the
  /// paper's, spends nearly all its time so).
  double steady_tokens_per_second() const;
  double samples_per_second() const { return virtual_seconds > 0 ? trained_samples / virtual_seconds : 0; }
};

/// Runs the setup in virtual time. Throws std::invalid_argument for a bad
/// setup and std::runtime_error when the run gets stuck (no event left before its end).
sim_result simulate(const sim_setup& setup);
/// simulate() with the controller's own info lines held back (warnings still
/// shown), as the commands run it: what they print is their summary.
sim_result simulate_quietly(const sim_setup& setup);

}  // namespace areal::sim
