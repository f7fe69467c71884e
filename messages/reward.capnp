# What a response is checked against: one task of the dataset.
@0xd6a1c2b7e9f03a41;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("areal::wire");

enum TaskKind {
  math @0;        # final answer compared with the references
  countdown @1;   # arithmetic expression over `numbers` that must equal `target`
  code @2;        # Python program run against ioCases and assertions in the sandbox
}

struct IoCase {
  input @0 :Text;
  expectedOutput @1 :Text;
}

struct RewardTask {
  schemaVersion @0 :UInt32;
  kind @1 :TaskKind;
  references @2 :List(Text);
  numbers @3 :List(Int64);
  target @4 :Int64;
  ioCases @5 :List(IoCase);
  assertions @6 :List(Text);
  caseTimeS @7 :Float32 = 5.0;
  totalTimeS @8 :Float32 = 20.0;
  partialCredit @9 :Bool;
  testSetup @10 :Text;            # trusted code the judge runs before the assertions
  entryPoints @11 :List(Text);    # the program's names the assertions use; empty: all
  lastNumberAnswer @12 :Bool;     # math: responses are bare numbers, the last one is the answer
}
