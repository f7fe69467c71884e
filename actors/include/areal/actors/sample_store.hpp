// The sample store: the trainer side's holder of scored trajectories. Reward
// pools hand it each scored trajectory and get its summary back (the summary
// travels on to the controller); the controller names slots for a batch and
// the store hands those trajectories to the trainer beside it.
#pragma once

#include <caf/actor_system.hpp>

#include "areal/actors/interfaces.hpp"

namespace areal {

/// What the controller is told of a trajectory kept under `slot`.
sample_summary summarize(const trajectory& t, uint64_t slot);

sample_store_actor spawn_sample_store(caf::actor_system& sys, trainer_actor trainer);

}  // namespace areal
