#!/usr/bin/env bash
# The GPU check, in one command, on a machine with an NVIDIA GPU, CUDA and
# PyTorch but none of this project's Debian packages and no network:
#   1. unpacks the .deb files of packages.txt (fetched beforehand by
#      fetch-debs.sh into bench/gpu/debs/) under a prefix;
#   2. builds the device check (AREAL_DEVICE_CHECK_ONLY: the libraries up to
#      kernels, test_device, bench_device) against PyTorch's LibTorch;
#   3. runs test_device on the GPU and bench_device's figures;
#   4. builds the RL job (bench_async_vs_sync) in a build folder of its own and
#      runs it on the device: sync against async eta = 1, 4, 8 on the long-tail
#      workload with the qwen2-0.5b shape (a failure there is in the JSON, the
#      figures before it stand);
#   5. with two or more GPUs, bench_weight_sync (same build): NCCL from GPU 0
#      into the other GPUs against a device-to-device copy;
#   6. prints one JSON (also written to WORK/check.json).
# Usage: bash bench/gpu/check.sh [--device cuda|cuda:N|cpu] [--debs DIR] [--work DIR]
#                                [--torch-dir DIR] [--quick] [--no-job] [--job-preset NAME]
#                                [--job-steps N]
# --device cpu runs every step but the GPU's own (how it is tested without one;
# the job then runs the micro preset).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
device=cuda
debs="$root/bench/gpu/debs"
work=/tmp/areal-gpu-check
torch_dir=""
quick=()
with_job=1
job_preset=""
job_steps=""
usage="usage: $0 [--device cuda|cuda:N|cpu] [--debs DIR] [--work DIR] [--torch-dir DIR] [--quick] [--no-job] [--job-preset NAME] [--job-steps N]"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --debs) debs="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --torch-dir) torch_dir="$2"; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --no-job) with_job=0; shift ;;
    --job-preset) job_preset="$2"; shift 2 ;;
    --job-steps) job_steps="$2"; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
# The job's model: Qwen2-0.5B's shape on a GPU; on the CPU (the script's own test) the micro preset.
if [ -z "$job_preset" ]; then
  job_preset=qwen2-0.5b
  [ "$device" = cpu ] && job_preset=micro
fi
# RL steps per run: enough that filling and draining the pipeline is a minor part (the benchmark prints its
# share), few enough that the whole check fits a 10-minute limit on a GPU machine (not yet timed on one:
# --quick or --job-steps make it shorter).
if [ -z "$job_steps" ]; then
  job_steps=20
  [ ${#quick[@]} -gt 0 ] && job_steps=10
fi
started=$(date +%s)
say() { echo "check.sh: $*" >&2; }
fail() { say "$*"; exit 1; }

# -- 0. Tools this machine must have.
missing=()
for tool in cmake c++ tar xz ar; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ -n "$torch_dir" ] || command -v python3 >/dev/null 2>&1 || missing+=("python3 (or --torch-dir)")
[ ${#missing[@]} -eq 0 ] || fail "missing tools: ${missing[*]}; install them (they come with any CUDA development setup)"
[ -f "$root/runtime/report/node_modules/uplot/dist/uPlot.iife.min.js" ] ||
  fail "runtime/report/node_modules/uplot is missing: the report page compiles it in; bring that folder from the development machine (where .ci/setup ran npm ci)"
generator=("Unix Makefiles")
command -v ninja >/dev/null 2>&1 && generator=(Ninja)

# -- 1. The Debian packages, unpacked under WORK/prefix.
prefix="$work/prefix"
mapfile -t packages < <(grep -v '^\s*\(#\|$\)' "$root/bench/gpu/packages.txt")
absent=()
for p in "${packages[@]}"; do
  compgen -G "$debs/${p}_*.deb" >/dev/null || absent+=("$p")
done
[ ${#absent[@]} -eq 0 ] || fail "no .deb in $debs for: ${absent[*]}. On a Debian 12 machine run: bash bench/gpu/fetch-debs.sh, and bring bench/gpu/debs/ here"
rm -rf "$prefix"
mkdir -p "$prefix"
for p in "${packages[@]}"; do
  deb=$(compgen -G "$debs/${p}_*.deb" | head -n 1)
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$deb" "$prefix"
  else
    # A .deb is an ar archive; its files are in data.tar.* (xz in Debian 12).
    member=$(ar t "$deb" | grep '^data\.tar')
    ar p "$deb" "$member" | tar -x -J -C "$prefix"
  fi
done
arch_lib="$prefix/usr/lib/x86_64-linux-gnu"
# Debian's .pc files say prefix=/usr (pkgconf is told the real one below); its packaging links
# some development names absolutely (/lib/...): point them into the prefix.
for link in "$arch_lib"/*.so; do
  target=$(readlink "$link" || true)
  case "$target" in /*) ln -sfn "$prefix$target" "$link" ;; esac
done
export LD_LIBRARY_PATH="$arch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Libraries linked by bare name (xxhash, pcre2-8) and their headers.
export LIBRARY_PATH="$arch_lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CPATH="$prefix/usr/include${CPATH:+:$CPATH}"
export PKG_CONFIG_LIBDIR="$arch_lib/pkgconfig:$prefix/usr/share/pkgconfig"
say "unpacked ${#packages[@]} packages under $prefix"

# -- 2. LibTorch: PyTorch's, or the one named. A CUDA LibTorch's CMake files look
# for the CUDA toolkit through nvcc: CUDA's usual place joins the PATH when nvcc is not on it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [ -z "$torch_dir" ]; then
  torch_dir=$(python3 -c 'import os, torch; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))') ||
    fail "python3 cannot import torch; name a LibTorch with --torch-dir DIR (the folder of TorchConfig.cmake)"
  abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  [ "$abi" = 1 ] || fail "this PyTorch ($(python3 -c 'import torch; print(torch.__version__)')) uses the pre-C++11 ABI; Debian's libraries use the C++11 ABI. Use PyTorch 2.7 or newer, or a cxx11-ABI LibTorch with --torch-dir"
fi
[ -f "$torch_dir/TorchConfig.cmake" ] || fail "no TorchConfig.cmake in $torch_dir"
say "LibTorch: $torch_dir"

# -- 3. Build the device check.
build="$work/build"
rm -f "$build/CMakeCache.txt"  # an earlier configure's cached look-ups would hide a changed prefix
cmake -S "$root" -B "$build" -G "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DAREAL_DEVICE_CHECK_ONLY=ON \
  -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu "-DCMAKE_PREFIX_PATH=$prefix/usr" -DTorch_DIR="$torch_dir" \
  -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf" "-DPKG_CONFIG_ARGN=--define-variable=prefix=$prefix/usr" \
  -DCMAKE_CXX_COMPILER_LAUNCHER= >"$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; fail "configure failed (all of it: $work/configure.log)"; }
grep -E "LibTorch|NCCL" "$work/configure.log" | sed 's/^-- /check.sh: /' >&2 || true
# Keep going past a failed file, so that one build reports every file that does not compile.
keep_going=(-k)
[ "${generator[0]}" = Ninja ] && keep_going=(-k 0)
cmake --build "$build" -j "$(nproc)" --target test_device bench_device -- "${keep_going[@]}" >"$work/build.log" 2>&1 ||
  { grep -E "error|undefined reference" "$work/build.log" | head -n 40 >&2; fail "build failed (all of it: $work/build.log)"; }
built=$(date +%s)
say "built in $((built - started)) s"

# -- 4. Run: the tests on the device, then the figures.
tests_result=passed
AREAL_TEST_DEVICE="$device" timeout 240 "$build/tests/test_device" >"$work/test_device.log" 2>&1 || tests_result=$?
case "$tests_result" in
  passed) ;;
  77) tests_result=skipped ;;
  *) tests_result=failed; tail -n 30 "$work/test_device.log" >&2 ;;
esac
say "test_device on $device: $tests_result"
# What a case could not check here (e.g. replicas on GPUs of their own, with one GPU), as its MESSAGE says.
test_notes=$(sed -n 's/.*MESSAGE: //p' "$work/test_device.log" | tr -d '"\\' | paste -sd ';' -)
timeout 300 "$build/bench/bench_device" --device "$device" "${quick[@]}" --json "$work/bench_device.json" | tee "$work/bench_device.log" >&2 ||
  fail "bench_device failed (its output: $work/bench_device.log)"

# -- 5. The RL job on the device: the whole project's libraries, in a build folder of its own (the device
# check above stays as it was); its failure is reported in the JSON, not fatal.
# run_bench NAME SECONDS COMMAND...: runs a benchmark of the job's build with its output beside the
# others (WORK/NAME.json, .log, .err); bench_result is "ran" or what failed, bench_figures its JSON or null.
run_bench() {
  local name="$1" limit="$2"
  shift 2
  bench_figures=null
  if timeout "$limit" "$@" --json "$work/$name.json" 2>"$work/$name.err" | tee "$work/$name.log" >&2; then
    bench_result=ran
    bench_figures=$(cat "$work/$name.json")
  else
    tail -n 20 "$work/$name.err" >&2
    bench_result="$(basename "$1") failed or ran past $limit s (its output: $work/$name.log, $work/$name.err)"
  fi
}
job_result=skipped
job_figures=null
nccl_result="skipped (runs in the job's build)"
nccl_figures=null
if [ "$with_job" = 1 ]; then
  job_build="$work/build-job"
  rm -f "$job_build/CMakeCache.txt"
  if ! cmake -S "$root" -B "$job_build" -G "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DAREAL_BUILD_TESTS=OFF \
    -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu "-DCMAKE_PREFIX_PATH=$prefix/usr" -DTorch_DIR="$torch_dir" \
    -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf" "-DPKG_CONFIG_ARGN=--define-variable=prefix=$prefix/usr" \
    -DCMAKE_CXX_COMPILER_LAUNCHER= >"$work/configure-job.log" 2>&1; then
    tail -n 30 "$work/configure-job.log" >&2
    job_result="configure failed (all of it: $work/configure-job.log)"
  # The reward service's helper programs too (build-job/libexec/areal), as the job finds them.
  elif ! cmake --build "$job_build" -j "$(nproc)" --target bench_async_vs_sync bench_weight_sync \
    areal-sandbox-supervisor areal-algebra \
    -- "${keep_going[@]}" >"$work/build-job.log" 2>&1; then
    grep -E "error|undefined reference" "$work/build-job.log" | head -n 40 >&2
    job_result="build failed (all of it: $work/build-job.log)"
  else
    grep -E "Gloo|NCCL" "$work/configure-job.log" | sed 's/^-- /check.sh: job build: /' >&2 || true
    say "job built at $(( $(date +%s) - started )) s; running sync and async eta = 1, 4, 8 ($job_preset, $job_steps steps)"
    run_bench async_vs_sync 330 "$job_build/bench/bench_async_vs_sync" --device "$device" --threads 1 \
      --workload long-tail --preset "$job_preset" --etas 1,4,8 --steps "$job_steps"
    job_result=$bench_result
    job_figures=$bench_figures
  fi
  say "the RL job on $device: $job_result"
  # (d) NCCL from GPU to GPU, where there are two (NCCL refuses two ranks on one GPU).
  gpus=0
  [ "$device" != cpu ] && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "$job_result" = ran ] && [ "$gpus" -ge 2 ]; then
    run_bench weight_sync 240 "$job_build/bench/bench_weight_sync" --quick
    nccl_result=$bench_result
    nccl_figures=$bench_figures
  elif [ "$device" = cpu ]; then
    nccl_result="not run with --device cpu"
  elif [ "$gpus" -lt 2 ]; then
    nccl_result="needs two GPUs (this machine shows $gpus; NCCL refuses two ranks on one GPU): (d) in bench_device measures the host staging"
  else
    nccl_result="not run: the job's build or run failed"
  fi
  say "NCCL from GPU to GPU: $nccl_result"
fi

finished=$(date +%s)
{
  echo "{"
  echo "  \"device\": \"$device\","
  echo "  \"torch_dir\": \"$torch_dir\","
  echo "  \"test_device\": \"$tests_result\","
  echo "  \"test_device_not_checked\": \"$test_notes\","
  echo "  \"build_seconds\": $((built - started)),"
  echo "  \"seconds\": $((finished - started)),"
  echo "  \"nccl_gpu_to_gpu_result\": \"$nccl_result\","
  echo "  \"nccl_gpu_to_gpu\": $nccl_figures,"
  echo "  \"bench_device\": $(cat "$work/bench_device.json"),"
  echo "  \"async_vs_sync_result\": \"$job_result\","
  echo "  \"async_vs_sync\": $job_figures"
  echo "}"
} >"$work/check.json"
cat "$work/check.json"
