#!/usr/bin/env bash
# Runs every fuzz harness (or those named) to RUNS executions each, two at a
# time, after building them with clang. Each harness keeps what it learns in
# build/fuzz-work/<name> (on top of the committed seeds in tests/fuzz/corpus),
# so a second run goes deeper. Findings land in build/fuzz-work/findings: add
# each one to tests/fuzz/corpus/<name>/ once fixed, as a regression input.
# usage: tests/fuzz/run_long.sh [RUNS] [HARNESS...]   (RUNS defaults to 1000000)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-1000000}
shift || true
build=build/fuzz  # where the main build puts them too
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S tests/fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
fi
cmake --build "$build" -j2
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  mapfile -t harnesses < <(cmake -P tests/fuzz/list_harnesses.cmake 2>&1)
fi
work=build/fuzz-work
mkdir -p "$work/findings" "$work/logs"
[ -x /usr/bin/llvm-symbolizer-14 ] && export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
run_one() {
  local name=$1 runs=$2 work=$3 build=$4
  mkdir -p "$work/$name"
  local start=$SECONDS status=ok
  "$build/fuzz_$name" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/findings/$name-" "$work/$name" "tests/fuzz/corpus/$name" \
    >"$work/logs/$name.log" 2>&1 || status=FINDING
  local done_runs
  done_runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/logs/$name.log")
  local cov
  cov=$(grep -o 'cov: [0-9]*' "$work/logs/$name.log" | tail -1)
  printf '%-32s %10s executions  %5d s  %-10s corpus %5d  %s\n' "$name" "${done_runs:-?}" $((SECONDS - start)) \
    "$cov" "$(find "$work/$name" -type f | wc -l)" "$status"
}
export -f run_one
printf '%s\n' "${harnesses[@]}" | xargs -P 2 -I{} bash -c 'run_one "$@"' _ {} "$runs" "$work" "$build"
if compgen -G "$work/findings/*" >/dev/null; then
  echo "findings:"; ls -1 "$work/findings"; exit 1
fi
echo "no findings"
