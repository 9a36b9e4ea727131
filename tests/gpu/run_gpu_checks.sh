#!/usr/bin/env bash
# tests/gpu/run_gpu_checks.sh OUTDIR
#
# The one-call GPU check (issue 6): on a machine with one NVIDIA GPU, build carpool's CUDA code,
# run every test labelled `gpu`, run the GPU benchmarks, print one short table and write the full
# log into OUTDIR. Needs bash, the CUDA toolkit (nvcc), CMake >= 3.24 and a C++20 compiler; Ninja
# is used when present. No network: everything comes from the tree or the machine.
#
# Build modes, chosen in this order:
#   full      the root project (cmake -S . -DCARPOOL_CUDA=ON), building only the
#             `carpool_gpu_checks` target (GPU tests and benchmarks with what they link). Needs
#             the Debian packages of scripts/install-deps.sh that a configure needs.
#   gpu-only  tests/gpu/CMakeLists.txt: kernels/cuda, its tests and the CUDA benchmark, nothing of
#             router/worker/client. abseil and GoogleTest are used when found, else the stand-ins
#             in tests/gpu/compat/ (the tests then run as one CTest entry per binary).
#   bundle    binaries built elsewhere by tests/gpu/make_gpu_bundle.sh (<repo>/gpu-bundle, or
#             CARPOOL_GPU_BUNDLE): nothing is built; every GPU test binary and both benchmarks
#             run from the bundle with its libraries. Chosen first when the bundle is there and
#             its binaries load on this machine (a machine without carpool's build dependencies
#             then still runs the end-to-end model tests and the model benchmark).
# Missing packages are looked up with dpkg; when some are missing and apt-get can reach a mirror
# (as root, within 30 s), the script installs them; otherwise it goes straight to gpu-only.
# GPU tests of the full project that are not in kernels/ (e.g. end-to-end ones) only exist in
# full mode; the summary says which mode ran.
#
# Time: finishes within ~8 minutes on one H200 (build ~1-2 min with 16 cores, since only the
# GPU's own architecture is compiled; tests ~1 min; benchmarks ~1 min); each phase has a
# timeout and the whole script a deadline (CARPOOL_GPU_CHECKS_DEADLINE_S, default 470 s).
#
# Outputs in OUTDIR: gpu_checks.log (everything), summary.txt (the table printed at the end),
# ctest.xml (JUnit), cuda_kernels_bench.txt / .json (benchmark table and rows), and in full
# mode gpu_model_bench.txt / .json (carpool-bench-gpu-model: decode tokens/s at batch 1/8/64/256,
# graphs on vs off, MBU at batch 1, prefill tokens/s for synthetic 1b (the real LlamaModel over
# host-generated weights) and 8b (the kernel sequence over weights filled on the device); ~1-2
# minutes, most of it generating the 1b weights and filling the 8b weights, twice each). The full
# mode's gpu tests include carpool_cuda_device_test (CudaDevice against the CPU kernels, graphs vs
# eager) and carpool_cuda_model_test (the engine on the GPU against the CPU: fp32 tokens equal,
# bf16 logprobs within 5e-2, graphs on vs off, KV pool from --gpu-memory-utilization).
# Environment: CARPOOL_GPU_BUILD_DIR (default <repo>/build-gpu), CARPOOL_GPU_MODE=full|gpu-only
# to force a mode, JOBS (default nproc).
# Exit status: 0 all passed; 1 a build, test or benchmark failed; 2 no GPU was visible (the build
# still ran and the tests reported themselves skipped); 3 no nvcc or cmake.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 3
fi
mkdir -p "$1"
OUTDIR=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD_BASE=${CARPOOL_GPU_BUILD_DIR:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc)}
DEADLINE_S=${CARPOOL_GPU_CHECKS_DEADLINE_S:-470}
LOG=$OUTDIR/gpu_checks.log
SUMMARY=$OUTDIR/summary.txt
START=$(date +%s)
: >"$LOG"
: >"$SUMMARY"

log() { echo "$*" >>"$LOG"; }
say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - START)); }
# Seconds a phase may take: its own budget, capped by what is left of the deadline.
budget() {
  local left=$((DEADLINE_S - $(elapsed)))
  if [ "$left" -lt "$1" ]; then echo $((left > 10 ? left : 10)); else echo "$1"; fi
}
# run NAME SECONDS CMD...: runs CMD with a timeout, output into the log only; returns its status.
run() {
  local name=$1 seconds=$2
  shift 2
  log ""
  log "=== $name ($(date -u +%H:%M:%S), timeout ${seconds}s): $*"
  timeout --kill-after=10 "$seconds" "$@" >>"$LOG" 2>&1
  local rc=$?
  log "=== $name: exit $rc after $(elapsed)s in total"
  [ $rc -eq 124 ] && say "$name: timed out after ${seconds}s"
  return $rc
}

declare -a ROWS=()
row() { ROWS+=("$(printf '%-10s %-58s %5ss' "$1" "$2" "$3")"); }

# ---------------------------------------------------------------------------------------------
# Machine.
say "carpool GPU checks: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
log "repository: $ROOT at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
BUNDLE=${CARPOOL_GPU_BUNDLE:-$ROOT/gpu-bundle}
# The CUDA runtime and cuBLAS for bundled binaries: the toolkit's, else the usual places.
CUDA_LIBS=""
for d in "${NVCC:+$(dirname "$NVCC")/../lib64}" "${NVCC:+$(dirname "$NVCC")/../lib}" \
  /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [ -n "$d" ] && [ -d "$d" ] && CUDA_LIBS="${CUDA_LIBS:+$CUDA_LIBS:}$d"
done
bundle_usable() {  # the bundle exists and its binaries load here
  [ -x "$BUNDLE/bin/carpool_cuda_kernels_test" ] || return 1
  LD_LIBRARY_PATH="$BUNDLE/lib${CUDA_LIBS:+:$CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$BUNDLE/bin/carpool_cuda_kernels_test" --gtest_list_tests >>"$LOG" 2>&1
}
USE_BUNDLE=0
if [ "${CARPOOL_GPU_MODE:-}" = bundle ] || { [ -z "${CARPOOL_GPU_MODE:-}" ] && [ -d "$BUNDLE" ]; }; then
  if bundle_usable; then
    USE_BUNDLE=1
    log "bundle: $BUNDLE"
    cat "$BUNDLE/MANIFEST" >>"$LOG" 2>/dev/null || true
  else
    say "bundle $BUNDLE is missing or its binaries do not load here (see the log); building instead"
  fi
fi
if [ "$USE_BUNDLE" -eq 0 ] && { [ -z "$NVCC" ] || ! command -v cmake >/dev/null; }; then
  say "error: need nvcc (PATH or /usr/local/cuda/bin) and cmake, or a usable gpu-bundle"
  exit 3
fi
[ -n "$NVCC" ] && export PATH="$(dirname "$NVCC"):$PATH"
GPU="none"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >>"$LOG" 2>&1; then
  GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
  nvidia-smi >>"$LOG" 2>&1
fi
say "gpu: $GPU"
log "nvcc: $([ -n "$NVCC" ] && "$NVCC" --version | tail -1 || echo none)"
log "cmake: $(cmake --version 2>/dev/null | head -1 || echo none); ninja: $(ninja --version 2>/dev/null || echo none)"
log "compiler: $(c++ --version 2>/dev/null | head -1)"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
# Only the GPU at hand is compiled for (much faster than the default sm_80 + sm_90 + PTX).
ARCHS="80-real;90-real;90-virtual"
if [ "$GPU" != "none" ]; then
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  if [[ "$CAP" =~ ^[0-9]+$ ]]; then ARCHS="${CAP}-real"; else ARCHS=native; fi
fi
log "CUDA architectures: $ARCHS"

FAILED=0
if [ "$USE_BUNDLE" -eq 1 ]; then
  MODE=bundle
  row build "skipped: prebuilt bundle ($(grep -m1 '^commit:' "$BUNDLE/MANIFEST" 2>/dev/null ||
    echo 'no MANIFEST'))" 0
else
# ---------------------------------------------------------------------------------------------
# Dependencies of the full build (scripts/install-deps.sh names them all).
FULL_PACKAGES=(libabsl-dev nlohmann-json3-dev libgtest-dev libgmock-dev libopenblas-dev
               libzmq3-dev cppzmq-dev libprotobuf-dev protobuf-compiler libopenmpi-dev
               libcpp-httplib-dev)
missing_packages() {
  local missing=()
  if ! command -v dpkg-query >/dev/null; then
    echo "${FULL_PACKAGES[*]}"  # not Debian: let the configure decide
    return
  fi
  for p in "${FULL_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  echo "${missing[*]}"
}
MISSING=$(missing_packages)
if [ -n "$MISSING" ] && [ "${CARPOOL_GPU_MODE:-}" != "gpu-only" ] && command -v apt-get >/dev/null &&
  [ "$(id -u)" -eq 0 ]; then
  log "missing packages: $MISSING; trying apt-get"
  if run "apt-get update" "$(budget 30)" env DEBIAN_FRONTEND=noninteractive apt-get update -qq; then
    # shellcheck disable=SC2086
    run "apt-get install" "$(budget 120)" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends $MISSING
    MISSING=$(missing_packages)
  else
    log "apt-get cannot reach a mirror; not installing"
  fi
fi
[ -n "$MISSING" ] && say "missing packages: $MISSING"

# ---------------------------------------------------------------------------------------------
# Configure: full if possible, else GPU-only.
MODE=${CARPOOL_GPU_MODE:-}
[ -z "$MODE" ] && { [ -z "$MISSING" ] && MODE=full || MODE=gpu-only; }
configure() {  # configure MODE BUILD_DIR
  local source=$ROOT
  [ "$1" = gpu-only ] && source=$ROOT/tests/gpu
  run "configure ($1)" "$(budget 120)" cmake -S "$source" -B "$2" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DCARPOOL_CUDA=ON -DCARPOOL_CUDA_ARCHITECTURES="$ARCHS" \
    -DCMAKE_CUDA_COMPILER="$NVCC"
}
T0=$(elapsed)
BUILD=$BUILD_BASE/$MODE
if ! configure "$MODE" "$BUILD"; then
  if [ "$MODE" = full ]; then
    say "full configure failed (see the log); falling back to the GPU-only build"
    MODE=gpu-only
    BUILD=$BUILD_BASE/$MODE
    configure "$MODE" "$BUILD" || { row configure "FAILED (gpu-only)" $(($(elapsed) - T0)); MODE=failed; }
  else
    row configure "FAILED (gpu-only)" $(($(elapsed) - T0))
    MODE=failed
  fi
fi
if [ "$MODE" = failed ]; then
  FAILED=1
else
  STANDINS=$(grep -h "carpool GPU-only build:" "$LOG" | sed 's/.*carpool GPU-only build: //' |
    tr '\n' ';' || true)
  row configure "ok, mode $MODE" $(($(elapsed) - T0))
  [ -n "$STANDINS" ] && log "GPU-only build: $STANDINS"

  # -------------------------------------------------------------------------------------------
  # Build only what the GPU checks need.
  T0=$(elapsed)
  if run build "$(budget 300)" cmake --build "$BUILD" --target carpool_gpu_checks -j "$JOBS"; then
    WARNINGS=$(grep -c "warning" "$LOG" || true)
    row build "ok ($WARNINGS warning lines in the log)" $(($(elapsed) - T0))
  else
    row build "FAILED (see the log)" $(($(elapsed) - T0))
    FAILED=1
  fi
fi

fi

# ---------------------------------------------------------------------------------------------
# Tests and benchmarks.
if [ "$FAILED" -eq 0 ]; then
  T0=$(elapsed)
  JUNIT=()
  ctest --help 2>/dev/null | grep -q -- --output-junit && JUNIT=(--output-junit "$OUTDIR/ctest.xml")
  if [ "$MODE" = bundle ]; then
    export LD_LIBRARY_PATH="$BUNDLE/lib${CUDA_LIBS:+:$CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    BIN=$BUNDLE/bin
    TEST_RC=0
    PASSED_N=0 FAILED_N=0 SKIPPED=0
    for t in "$BIN"/*_test; do
      out=$OUTDIR/.gtest_$(basename "$t").txt
      run "gpu test $(basename "$t")" "$(budget 180)" bash -c "'$t' >'$out' 2>&1; rc=\$?; cat '$out'; exit \$rc" ||
        TEST_RC=1
      PASSED_N=$((PASSED_N + $(grep -oE '^\[  PASSED  \] [0-9]+' "$out" | grep -oE '[0-9]+$' || echo 0)))
      FAILED_N=$((FAILED_N + $(grep -oE '^\[  FAILED  \] [0-9]+ test' "$out" | grep -oE '[0-9]+' || echo 0)))
      SKIPPED=$((SKIPPED + $(grep -oE '^\[  SKIPPED \] [0-9]+' "$out" | grep -oE '[0-9]+$' || echo 0)))
      rm -f "$out"
    done
    RESULT="$PASSED_N passed, $FAILED_N failed (bundle)"
  else
    BIN=$BUILD/bin
    run "gpu tests" "$(budget 200)" ctest --test-dir "$BUILD" -L gpu --output-on-failure \
      --timeout 180 -j 4 "${JUNIT[@]}"
    TEST_RC=$?
    RESULT=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$LOG" | tail -1)
    SKIPPED=$(sed -n '/The following tests did not run:/,/^$/p' "$LOG" | grep -c "Skipped" || true)
  fi
  row "gpu tests" "${RESULT:-no result} ($SKIPPED skipped)" $(($(elapsed) - T0))
  [ "$TEST_RC" -ne 0 ] && FAILED=1
  if [ "$GPU" != "none" ] && [ "$SKIPPED" -gt 0 ]; then
    say "a GPU is visible but tests skipped themselves: is the driver older than the CUDA runtime?"
    FAILED=1
  fi

  T0=$(elapsed)
  BENCH_TXT=$OUTDIR/cuda_kernels_bench.txt
  if run "cuda kernels bench" "$(budget 150)" bash -c \
    "'$BIN/carpool-bench-cuda-kernels' --json '$OUTDIR/cuda_kernels_bench.json' \
       >'$BENCH_TXT' 2>&1; rc=\$?; cat '$BENCH_TXT'; exit \$rc"; then
    row bench "ok" $(($(elapsed) - T0))
  else
    row bench "FAILED or skipped (see $BENCH_TXT)" $(($(elapsed) - T0))
    [ "$GPU" != "none" ] && FAILED=1
  fi

  # Model benchmark (full mode only: it needs worker/): decode tokens/s at batch 1/8/64/256,
  # graphs on vs off, MBU at batch 1, prefill tokens/s, for synthetic 1b and 8b shapes.
  MODEL_TXT=$OUTDIR/gpu_model_bench.txt
  if [ -x "$BIN/carpool-bench-gpu-model" ]; then
    T0=$(elapsed)
    if run "gpu model bench" "$(budget 180)" bash -c \
      "'$BIN/carpool-bench-gpu-model' --presets 1b,8b --steps 10 \
         --json '$OUTDIR/gpu_model_bench.json' >'$MODEL_TXT' 2>&1; rc=\$?; cat '$MODEL_TXT'; exit \$rc"; then
      row "model" "ok" $(($(elapsed) - T0))
    else
      row "model" "FAILED or skipped (see $MODEL_TXT)" $(($(elapsed) - T0))
      [ "$GPU" != "none" ] && FAILED=1
    fi
  fi
fi

# ---------------------------------------------------------------------------------------------
# Summary.
{
  echo ""
  echo "carpool GPU checks, $(date -u '+%Y-%m-%d'), gpu: $GPU, mode: $MODE, total $(elapsed)s"
  printf '%-10s %-58s %6s\n' phase result time
  for r in "${ROWS[@]}"; do echo "$r"; done
  if [ -f "${BENCH_TXT:-/nonexistent}" ]; then
    echo ""
    grep -v "^device 0" "$BENCH_TXT" | head -60
  fi
  if [ -f "${MODEL_TXT:-/nonexistent}" ]; then
    echo ""
    head -30 "$MODEL_TXT"
  fi
  echo ""
  echo "full log: $LOG"
} | tee "$SUMMARY" | tee -a "$LOG"

if [ "$FAILED" -ne 0 ]; then exit 1; fi
if [ "$GPU" = "none" ]; then exit 2; fi
exit 0
