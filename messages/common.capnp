# Shared definitions of the AReaL wire format. Every top-level record starts
# with `schemaVersion`: a reader refuses a record written under another version.
@0x8aa787c42ea09253;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("areal::wire");

# Bump when a change is not a compatible Cap'n Proto evolution (renumbered or
# retyped fields, changed meaning). Adding fields at the end does not need it.
const schemaVersion :UInt32 = 1;
