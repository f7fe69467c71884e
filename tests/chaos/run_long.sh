#!/usr/bin/env bash
# The long chaos run: test_chaos's case (tests/test_chaos.cpp) with a longer
# fault schedule, outside CTest's time limit. After a build in build/:
#   tests/chaos/run_long.sh [FAULTS [SEED]]     (default: 100 faults, seed 1)
# It prints the faults by kind, the samples admitted / trained / dropped by
# reason, lost, trained twice, hung processes, and wall time and accuracy
# against the same run without faults; it exits non-zero if any check failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
faults=${1:-100}
seed=${2:-1}
bin=build/tests/test_chaos
if [[ ! -x $bin ]]; then
  echo "run_long.sh: $bin is missing: build first (cmake --build build -j2)" >&2
  exit 2
fi
AREAL_CHAOS_FAULTS=$faults AREAL_CHAOS_SEED=$seed OMP_WAIT_POLICY=PASSIVE "$bin"
