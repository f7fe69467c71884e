# Control records between nodes: the handshake and periodic statistics.
@0xa33199ff0c165df3;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("areal::wire");

struct NodeHello {
  schemaVersion @0 :UInt32;
  protocolVersion @1 :UInt32;      # version of the actor message protocol
  appId @2 :Text;                  # cluster identifier from the topology
  nodeName @3 :Text;
  roles @4 :List(Text);
  host @5 :Text;                   # address the node listens on
  port @6 :UInt16;                 # 0: the node does not listen
  pid @7 :UInt32;
  hostname @8 :Text;
  build @9 :Text;                  # areal version string
  wallClockNs @10 :Int64;          # sender's clock when sent, for offset estimates
}

struct NodeStats {
  schemaVersion @0 :UInt32;
  nodeName @1 :Text;
  uptimeNs @2 :Int64;
  peersConnected @3 :UInt32;
  peersLost @4 :UInt32;
  trajectoriesReceived @5 :UInt64;
  trajectoriesSent @6 :UInt64;
  bytesReceived @7 :UInt64;
  bytesSent @8 :UInt64;
}
