# Work handed to a rollout worker: one sample of one prompt's group.
@0xe476a01531fc2bde;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("areal::wire");
using import "trajectory.capnp".FinishReason;

struct SamplingParams {
  temperature @0 :Float32 = 1.0;   # logits are divided by this before softmax
  topK @1 :UInt32;                 # 0: no top-k cut
  topP @2 :Float32 = 1.0;          # 1.0: no nucleus cut
  greedy @3 :Bool;                 # argmax instead of sampling
  maxNewTokens @4 :UInt32 = 256;
  stopTokens @5 :List(Int32);
}

struct GenerationRequest {
  schemaVersion @0 :UInt32;
  promptId @1 :UInt64;
  groupId @2 :UInt64;
  sampleIndex @3 :UInt32;          # position of this sample inside its group
  promptTokens @4 :List(Int32);
  sampling @5 :SamplingParams;
  seed @6 :UInt64;                 # same seed + same weights -> same tokens
  admittedVersion @7 :Int64;       # policy version when the controller admitted it
  soFar @8 :OutputSoFar;           # a resumed run continues the sample from here
}

# What a sample had generated when a run checkpoint saved it: the engine
# re-prefills prompt + these tokens and goes on sampling (its generator
# advanced past their draws); a finished one (stop, length) is only scored.
struct OutputSoFar {
  tokens @0 :List(Int32);
  logprobs @1 :List(Float32);      # one per token
  versions @2 :List(Int64);        # the policy version that sampled each token
  finish @3 :FinishReason;         # unfinished, stop or length
}
