// The sample store: the trainer side's holder of scored trajectories. Reward
// pools hand it each scored trajectory and get its summary back (the summary
// travels on to the controller); the controller names slots for a batch and
// the store hands those trajectories to the trainer beside it.
#pragma once

#include <string>

#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"

namespace areal {

/// What the controller is told of a trajectory kept under `slot`.
sample_summary summarize(const trajectory& t, uint64_t slot);
/// The summary of one sample held as several trajectories (an episode split
/// where its client rewrote the history): the last one's ids and reward, the
/// generated tokens and versions of all.
sample_summary summarize(const std::vector<trajectory>& segments, uint64_t slot);

/// `record_path` (optional): every trajectory handed to the trainer is also
/// appended there as one JSON line (rl.record_trajectories), for inspection.
sample_store_actor spawn_sample_store(caf::actor_system& sys, trainer_actor trainer, std::string record_path = {});

}  // namespace areal
