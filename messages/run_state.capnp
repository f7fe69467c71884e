# The controller's part of a run checkpoint: counters, drop reasons and the
# prompt stream's position, saved beside the trainer's state (the file
# controller_state.capnp of a checkpoint directory).
@0xc4a1f27d9b3e5a61;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("areal::wire");
using import "trajectory.capnp".Trajectory;

struct DropCount {
  reason @0 :Text;
  count @1 :Int64;
}

struct RunState {
  schemaVersion @0 :UInt32;
  version @1 :Int64;               # policy version of the checkpoint
  steps @2 :Int64;
  admitted @3 :Int64;              # = trained + dropped: unfinished work is re-queued (with what it had done), not counted
  trained @4 :Int64;
  dropped @5 :Int64;
  dropReasons @6 :List(DropCount);
  maxStaleness @7 :Int64;
  rewardMeanFirst @8 :Float64;
  rewardMeanLast @9 :Float64;
  sourcePosition @10 :UInt64;      # prompts taken from the stream
  requeue @11 :List(UInt64);       # stream positions of groups started but not trained
  droppedPositions @12 :List(UInt64);
  nextGroup @13 :UInt64;
  generatedTokens @14 :Int64;
  trainedTokens @15 :Int64;
  elapsedS @16 :Float64;           # run time before this checkpoint
  metricsBytes @17 :Int64 = -1;    # size of metrics.jsonl at this checkpoint (-1: not recorded)
  requeueGroups @18 :List(UInt64); # the group id of each requeue entry (empty: a resume gives new ids)
  saved @19 :List(SavedSample);    # the work done on the samples of those groups
}

# A sample of a re-queued group with the work done on it: generating (one
# trajectory, finishReason unfinished: the tokens so far), generated (one, not
# scored) or scored (the trajectories the sample store holds for it). A resumed
# run continues it instead of generating it again.
struct SavedSample {
  segments @0 :List(Trajectory);
  scored @1 :Bool;
}
