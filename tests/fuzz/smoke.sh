#!/usr/bin/env bash
# One harness, briefly: replays its committed corpus (every past finding is in
# it), then fuzzes for SECONDS. A finding fails the test, and its input is
# kept under FINDINGS_DIR for the developer to add to the corpus once fixed.
# usage: smoke.sh HARNESS CORPUS_DIR SECONDS FINDINGS_DIR
set -euo pipefail
harness=$1 corpus=$2 seconds=$3 findings=$4
name=$(basename "$harness")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$findings"
[ -x /usr/bin/llvm-symbolizer-14 ] && export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
# New inputs go to the scratch directory (first); the committed corpus is only read.
if ! "$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/$name-" "$scratch" "$corpus" >"$scratch/log" 2>&1; then
  tail -n 60 "$scratch/log"
  echo "$name: FINDING (input kept in $findings)"
  exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/log")
seeds=$(find "$corpus" -type f | wc -l)
echo "$name: $runs executions in $seconds s from $seeds seed inputs, no finding"
