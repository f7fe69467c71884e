# A generated sample on its way rollout -> reward -> buffer -> trainer.
@0x9d3cbbaf6d853559;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("areal::wire");

enum FinishReason {
  unfinished @0;
  stop @1;        # a stop token was sampled
  length @2;      # max new tokens reached
  aborted @3;     # cancelled (worker lost, run ended)
}

enum Verdict {
  unscored @0;
  correct @1;
  wrong @2;
  noAnswer @3;
  timeout @4;
  error @5;
  sandboxViolation @6;
}

struct Timestamps {
  # Nanoseconds since the Unix epoch on the clock of the node that set them; 0 = not yet.
  admittedNs @0 :Int64;
  generationStartNs @1 :Int64;
  generationEndNs @2 :Int64;
  scoredNs @3 :Int64;
  scoringStartNs @4 :Int64;
}

struct Trajectory {
  schemaVersion @0 :UInt32;
  promptId @1 :UInt64;
  groupId @2 :UInt64;
  sampleIndex @3 :UInt32;
  promptTokens @4 :List(Int32);
  outputTokens @5 :List(Int32);
  # One entry per output token: log-probability under the policy that sampled it
  # (the behaviour policy) and that policy's version. A trajectory interrupted by
  # a weight update holds tokens of several versions.
  behaviourLogprobs @6 :List(Float32);
  tokenVersions @7 :List(Int64);
  finishReason @8 :FinishReason;
  reward @9 :Float32;
  verdict @10 :Verdict;
  verdictDetail @11 :Text;
  timestamps @12 :Timestamps;
  producer @13 :Text;              # name of the node that generated it
  promptVersion @14 :Int64;        # the version of the prompt tokens: the policy version at admission
  # One entry per output token, or empty (every output token was generated and
  # is trained). A multi-turn episode's output holds the model's turns (1) and
  # the template, tool and environment tokens between them (0, never trained).
  lossMask @15 :List(UInt8);
}
