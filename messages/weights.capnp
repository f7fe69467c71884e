# Describes one published policy version: where each tensor lies in one flat buffer.
@0xc389c5bb4b8d5a40;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("areal::wire");

enum DType {
  f32 @0;
  bf16 @1;
  f16 @2;
  i64 @3;
  i32 @4;
  u8 @5;
}

struct TensorEntry {
  name @0 :Text;                   # Hugging Face parameter name
  dtype @1 :DType;
  shape @2 :List(Int64);
  offset @3 :UInt64;               # byte offset into the weight buffer
}

struct WeightManifest {
  schemaVersion @0 :UInt32;
  version @1 :Int64;               # policy version these weights are
  tensors @2 :List(TensorEntry);
  totalBytes @3 :UInt64;           # size of the buffer the offsets point into
  checksum @4 :UInt64;             # XXH64 (seed 0) of the whole buffer; 0: not computed (in transit
                                   # every chunk travels with its own XXH3-64, computed by the sender)
  chunkBytes @5 :UInt64;           # the buffer travels in chunks of this size (the last may be shorter); 0: whole
}
