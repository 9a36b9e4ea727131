#!/usr/bin/env bash
# tests/gpu/run_gpu_checks.sh [OUTDIR]
#
# The one-call GPU check (issues 6 and 18). On a machine with NVIDIA GPUs it runs, in order:
#   1. build      nothing when a bundle is there (tests/gpu/make_gpu_bundle.sh); else the root
#                 project's `carpool_gpu_checks` target (mode full) or, without carpool's build
#                 packages, tests/gpu/CMakeLists.txt (mode gpu-only: kernels only).
#   2. tests      every gpu-labelled test binary (`ctest -N -L gpu` of the build, or the bundle's
#                 list), one step each, except the tensor-parallel ones, which run in 3.
#   3. tp         carpool_cuda_tp_test (TP=2 in one process: both ranks on GPU 0 staged through
#                 the host, and over NCCL where two GPUs exist), the NCCL communicator tests (a
#                 one-rank communicator's collective calls; two ranks where two GPUs exist), and
#                 tp2-mpirun: tests/gpu/tp2_gpu_check.sh, router + a TP-2 carpool-worker under
#                 mpirun, over NCCL with two GPUs, else over the MPI transport with both ranks
#                 on the one GPU, tokens against TP=1 on the CPU. Skipped where mpirun is missing.
#   4. benchmarks carpool-bench-cuda-kernels, then carpool-bench-gpu-model (decode tokens/s at
#                 batch 1/8/64/256, MBU at batch 1 against the measured copy bandwidth, graphs
#                 on/off, and through the engine device vs host sampling and async on/off).
# Each step has its own timeout, capped by what is left of the deadline
# (CARPOOL_GPU_CHECKS_DEADLINE_S, default 450 s, under the 8 minutes the issue gives on one H200),
# so one hang cannot eat the budget; a step the deadline leaves no time for is skipped, saying so.
# Each step prints one line: name, ran/passed/failed/skipped, seconds, what it saw.
#
# Without a GPU (none listed by nvidia-smi, or CUDA_VISIBLE_DEVICES empty) nothing is built or
# run: every step above is reported skipped with the reason (test binaries that exist are only
# asked to list their tests, which shows they load), in a few seconds, exit 0.
#
# Outputs in OUTDIR (default $OUT when set; at most 8 files, as the device tool brings back):
# gpu_checks.json (every step: name, kind, status, seconds, detail, gtest counts; the machine,
# the mode, the total), gpu_checks.md (the same as a Markdown table), gpu_checks.log (every
# command's output), cuda_kernels_bench.{txt,json} and gpu_model_bench.{txt,json}.
#
# Modes, chosen in this order: bundle (<repo>/gpu-bundle, CARPOOL_GPU_BUNDLE, or the folder this
# script sits in when it is a bundle's copy; used when its binaries load here), full, gpu-only
# (CARPOOL_GPU_MODE=bundle|full|gpu-only forces one). The full and gpu-only builds need the CUDA
# toolkit (nvcc), CMake >= 3.24 and a C++20 compiler; missing Debian packages are installed
# with apt-get when it can reach a mirror within 30 s. Without a GPU the tests are listed from
# the bundle, else from CARPOOL_BUILD_DIR (default <repo>/build) when it is configured.
# Environment: CARPOOL_GPU_BUILD_DIR (default <repo>/build-gpu), JOBS (default nproc),
# CARPOOL_GPU_MODEL_BENCH_FLAGS (default "--presets 1b,8b --steps 10").
# Exit status: 0 no step failed (skips allowed; so 0 without a GPU); 1 a step failed; 3 a GPU
# is visible but there is neither a usable bundle nor nvcc and cmake.
set -uo pipefail

OUTARG=${1:-${OUT:-}}
if [ -z "$OUTARG" ]; then
  echo "usage: $0 OUTDIR (or set OUT)" >&2
  exit 3
fi
mkdir -p "$OUTARG"
OUTDIR=$(cd "$OUTARG" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD_BASE=${CARPOOL_GPU_BUILD_DIR:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc)}
DEADLINE_S=${CARPOOL_GPU_CHECKS_DEADLINE_S:-450}
LOG=$OUTDIR/gpu_checks.log
START=$(date +%s)
: >"$LOG"

log() { echo "$*" >>"$LOG"; }
say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((DEADLINE_S - $(elapsed))); }
# Seconds a step may take: its own budget, capped by what is left of the deadline.
budget() {
  local l
  l=$(left)
  if [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi
}
# run NAME SECONDS CMD...: runs CMD with a timeout, output into the log only; returns its status
# (124 on the timeout).
run() {
  local name=$1 seconds=$2
  shift 2
  log ""
  log "=== $name ($(date -u +%H:%M:%S), timeout ${seconds}s): $*"
  timeout --kill-after=10 "$seconds" "$@" >>"$LOG" 2>&1
  local rc=$?
  log "=== $name: exit $rc after $(elapsed)s in total"
  return $rc
}
json_escape() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr '\n\t' '  '; }

# Steps, in the order they ran. step KIND NAME STATUS SECONDS DETAIL [PASSED FAILED SKIPPED]
declare -a S_KIND=() S_NAME=() S_STATUS=() S_SECONDS=() S_DETAIL=() S_COUNTS=()
FAILED=0
step() {
  S_KIND+=("$1") S_NAME+=("$2") S_STATUS+=("$3") S_SECONDS+=("$4") S_DETAIL+=("$5")
  S_COUNTS+=("${6:-}|${7:-}|${8:-}")
  [ "$3" = failed ] && FAILED=1
  printf '%-9s %-40s %-8s %4ss  %s\n' "$1" "$2" "$3" "$4" "$5" | tee -a "$LOG"
}

# ---------------------------------------------------------------------------------------------
# Machine.
say "carpool GPU checks: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), output in $OUTDIR"
log "repository: $ROOT at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
[ -n "$NVCC" ] && export PATH="$(dirname "$NVCC"):$PATH"
GPU="none"
GPUS=0
NO_GPU_REASON=""
if [ "${CUDA_VISIBLE_DEVICES+set}" = set ] && [ -z "${CUDA_VISIBLE_DEVICES}" ]; then
  NO_GPU_REASON="no GPU visible (CUDA_VISIBLE_DEVICES is empty)"
elif ! command -v nvidia-smi >/dev/null; then
  NO_GPU_REASON="no GPU visible (no nvidia-smi on this machine)"
elif ! nvidia-smi -L >>"$LOG" 2>&1; then
  NO_GPU_REASON="no GPU visible (nvidia-smi -L lists none)"
else
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    visible=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    [ "$visible" -lt "$GPUS" ] && GPUS=$visible
  fi
  if [ "$GPUS" -eq 0 ]; then
    NO_GPU_REASON="no GPU visible (nvidia-smi -L lists none)"
  else
    GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
    nvidia-smi >>"$LOG" 2>&1
  fi
fi
say "gpu: $GPU ($GPUS visible)${NO_GPU_REASON:+: $NO_GPU_REASON}"
log "nvcc: $([ -n "$NVCC" ] && "$NVCC" --version | tail -1 || echo none)"
log "mpirun: $(command -v mpirun || echo none); python3: $(command -v python3 || echo none)"

# The CUDA runtime, cuBLAS and NCCL for bundled binaries: the toolkit's, the usual places, and
# the NVIDIA wheels of a Python environment (the lent H200 image has NCCL only there).
CUDA_LIBS=""
add_libdir() { [ -d "$1" ] && case ":$CUDA_LIBS:" in *":$1:"*) ;; *) CUDA_LIBS="${CUDA_LIBS:+$CUDA_LIBS:}$1" ;; esac; }
for d in "${NVCC:+$(dirname "$NVCC")/../lib64}" "${NVCC:+$(dirname "$NVCC")/../lib}" \
  /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [ -n "$d" ] && add_libdir "$(cd "$d" 2>/dev/null && pwd)"
done
if [ "$GPUS" -gt 0 ]; then
  in_cuda_libs() {
    local d
    IFS=: read -ra dirs <<<"$CUDA_LIBS"
    for d in "${dirs[@]}"; do [ -e "$d/$1" ] && return 0; done
    return 1
  }
  for lib in libnccl.so.2 libcublasLt.so.13 libcudart.so.13; do
    if ! ldconfig -p 2>/dev/null | grep -q "$lib" && ! in_cuda_libs "$lib"; then
      found=$(find /usr/local /opt /usr/lib -maxdepth 9 -name "$lib" 2>/dev/null | head -1)
      [ -n "$found" ] && add_libdir "$(dirname "$found")" && log "found $lib in $(dirname "$found")"
    fi
  done
fi

# ---------------------------------------------------------------------------------------------
# Build or bundle.
BUNDLE=${CARPOOL_GPU_BUNDLE:-}
if [ -z "$BUNDLE" ]; then
  if grep -q "^carpool GPU bundle" "$ROOT/MANIFEST" 2>/dev/null; then BUNDLE=$ROOT; else BUNDLE=$ROOT/gpu-bundle; fi
fi
bundle_env() { echo "$BUNDLE/lib${CUDA_LIBS:+:$CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
bundle_usable() {  # the bundle exists (unpacked here if needed) and its binaries load here
  if [ ! -x "$BUNDLE/bin/carpool_cuda_kernels_test" ] && [ -f "$BUNDLE/payload.tar.gz" ]; then
    if [ ! -w "$BUNDLE" ]; then  # a read-only bundle: unpack a copy
      mkdir -p /tmp/carpool-gpu-bundle && cp "$BUNDLE/MANIFEST" "$BUNDLE/payload.tar.gz" /tmp/carpool-gpu-bundle/
      BUNDLE=/tmp/carpool-gpu-bundle
    fi
    log "unpacking $BUNDLE/payload.tar.gz"
    tar -C "$BUNDLE" -xzf "$BUNDLE/payload.tar.gz" >>"$LOG" 2>&1 || return 1
  fi
  [ -x "$BUNDLE/bin/carpool_cuda_kernels_test" ] || return 1
  LD_LIBRARY_PATH=$(bundle_env) "$BUNDLE/bin/carpool_cuda_kernels_test" --gtest_list_tests \
    >>"$LOG" 2>&1
}
MODE=""
BIN=""      # benchmarks and carpool binaries
TESTS=()    # gpu-labelled test binaries, full paths
T0=$(elapsed)
if [ "${CARPOOL_GPU_MODE:-}" = bundle ] || { [ -z "${CARPOOL_GPU_MODE:-}" ] && [ -d "$BUNDLE" ]; }; then
  if bundle_usable; then
    MODE=bundle
    BIN=$BUNDLE/bin
    export LD_LIBRARY_PATH
    LD_LIBRARY_PATH=$(bundle_env)
    log "bundle: $BUNDLE"
    cat "$BUNDLE/MANIFEST" >>"$LOG" 2>/dev/null || true
    for t in $(grep '^tests:' "$BUNDLE/MANIFEST" 2>/dev/null | cut -d: -f2-); do
      TESTS+=("$BIN/$t")
    done
    [ ${#TESTS[@]} -eq 0 ] && TESTS=("$BIN"/*_test)
    step build bundle skipped 0 "prebuilt bundle: $(grep -m1 '^commit:' "$BUNDLE/MANIFEST" 2>/dev/null || echo 'no MANIFEST')"
  else
    say "bundle $BUNDLE is missing or its binaries do not load here (see the log)"
  fi
fi

# The gpu-labelled test binaries of a configured build, from CTest.
ctest_gpu_binaries() {
  ctest --test-dir "$1" -N -V -L gpu 2>/dev/null | awk '/Test command:/ {print $4}' |
    awk '!seen[$0]++'
}

if [ -z "$MODE" ] && [ "$GPUS" -eq 0 ]; then
  MODE=none
  LISTED=${CARPOOL_BUILD_DIR:-$ROOT/build}
  if [ -f "$LISTED/CTestTestfile.cmake" ] && command -v ctest >/dev/null; then
    mapfile -t TESTS < <(ctest_gpu_binaries "$LISTED")
    BIN=$LISTED/bin
    step build build skipped 0 "$NO_GPU_REASON: nothing built; tests listed from $LISTED"
  else
    step build build skipped 0 "$NO_GPU_REASON: nothing built, and no bundle or configured build to list the tests from"
  fi
fi

if [ -z "$MODE" ]; then
  if [ -z "$NVCC" ] || ! command -v cmake >/dev/null; then
    say "error: a GPU is visible but there is no usable gpu-bundle, and no nvcc (PATH or /usr/local/cuda/bin) and cmake to build"
    exit 3
  fi
  ARCHS=native
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ "$CAP" =~ ^[0-9]+$ ]] && ARCHS="${CAP}-real"
  log "CUDA architectures: $ARCHS"
  GENERATOR=()
  command -v ninja >/dev/null && GENERATOR=(-G Ninja)
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
  MODE=${CARPOOL_GPU_MODE:-}
  [ -z "$MODE" ] && { [ -z "$MISSING" ] && MODE=full || MODE=gpu-only; }
  configure() {  # configure MODE BUILD_DIR
    local source=$ROOT
    [ "$1" = gpu-only ] && source=$ROOT/tests/gpu
    run "configure ($1)" "$(budget 120)" cmake -S "$source" -B "$2" "${GENERATOR[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DCARPOOL_CUDA=ON -DCARPOOL_CUDA_ARCHITECTURES="$ARCHS" \
      -DCMAKE_CUDA_COMPILER="$NVCC"
  }
  BUILD=$BUILD_BASE/$MODE
  if ! configure "$MODE" "$BUILD" && [ "$MODE" = full ]; then
    say "full configure failed (see the log); falling back to the GPU-only build"
    MODE=gpu-only
    BUILD=$BUILD_BASE/$MODE
    configure "$MODE" "$BUILD" || MODE=failed
  elif [ ! -f "$BUILD/CMakeCache.txt" ]; then
    MODE=failed
  fi
  if [ "$MODE" = failed ]; then
    step build configure failed $(($(elapsed) - T0)) "configure failed (see gpu_checks.log)"
  elif run build "$(budget 300)" cmake --build "$BUILD" --target carpool_gpu_checks -j "$JOBS"; then
    step build "$MODE" passed $(($(elapsed) - T0)) "built carpool_gpu_checks in $BUILD ($(grep -c warning "$LOG" || true) warning lines in the log)"
    BIN=$BUILD/bin
    mapfile -t TESTS < <(ctest_gpu_binaries "$BUILD")
  else
    step build "$MODE" failed $(($(elapsed) - T0)) "build failed or timed out (see gpu_checks.log)"
    MODE=failed
  fi
fi
log "mode: $MODE; test binaries: ${TESTS[*]:-none}"

# ---------------------------------------------------------------------------------------------
# Test binaries. gtest_step KIND PATH [GTEST FLAGS...]: runs one gtest binary as a step.
count() { grep -oE "^\[  $1 *\] [0-9]+ test" "$2" | grep -oE '[0-9]+' | tail -1; }
missing_libs() { ldd "$1" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' '; }
gtest_step() {
  local kind=$1 path=$2 name
  shift 2
  name=$(basename "$path")
  if [ "$GPUS" -eq 0 ]; then
    local listed=""
    [ -x "$path" ] && listed=$("$path" --gtest_list_tests 2>/dev/null | grep -c '^  ')
    step "$kind" "$name" skipped 0 "$NO_GPU_REASON${listed:+ (the binary loads and lists $listed tests)}"
    return
  fi
  if [ "$MODE" = failed ]; then
    step "$kind" "$name" skipped 0 "not built: the build failed"
    return
  fi
  if [ ! -x "$path" ]; then
    step "$kind" "$name" failed 0 "binary missing: $path"
    return
  fi
  local miss
  miss=$(missing_libs "$path")
  if [ -n "$miss" ]; then
    step "$kind" "$name" failed 0 "does not load here: missing $miss"
    return
  fi
  local seconds
  seconds=$(budget "${GTEST_TIMEOUT_S:-150}")
  if [ "$seconds" -lt 5 ]; then
    step "$kind" "$name" skipped 0 "deadline: no time left"
    return
  fi
  local out t0=$(elapsed) rc
  out=$(mktemp)
  run "$name" "$seconds" bash -c '"$@" >"'"$out"'" 2>&1; rc=$?; cat "'"$out"'"; exit $rc' _ "$path" "$@"
  rc=$?
  local p f s
  p=$(count PASSED "$out") f=$(count FAILED "$out") s=$(count SKIPPED "$out")
  local detail="${p:-0} passed, ${f:-0} failed, ${s:-0} skipped"
  local status=passed
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status=failed detail="timed out after ${seconds}s; $detail"
  elif [ $rc -ne 0 ]; then
    status=failed detail="exit $rc; $detail"
  elif grep -q "no CUDA device" "$out"; then
    status=failed detail="a GPU is visible but tests skipped with 'no CUDA device' (driver older than the CUDA runtime?); $detail"
  elif [ "${p:-0}" -eq 0 ] && [ "${s:-0}" -gt 0 ]; then
    status=skipped
  fi
  if [ "${s:-0}" -gt 0 ]; then  # the first skipped tests by name
    detail="$detail: $(grep -oE '^\[  SKIPPED \] [A-Za-z_][A-Za-z0-9_/]*\.[A-Za-z0-9_/]+' "$out" |
      cut -c14- | sort -u | head -3 | tr '\n' ' ')"
  fi
  rm -f "$out"
  step "$kind" "$name" "$status" $(($(elapsed) - t0)) "$detail" "${p:-0}" "${f:-0}" "${s:-0}"
}

TP_TESTS=(carpool_cuda_tp_test carpool_nccl_communicator_test carpool_nccl_device_collectives_test)
is_tp_test() { local t; for t in "${TP_TESTS[@]}"; do [ "$1" = "$t" ] && return 0; done; return 1; }
if [ ${#TESTS[@]} -eq 0 ]; then
  step test gpu-tests skipped 0 "${NO_GPU_REASON:-no test binaries}: no gpu-labelled test binaries found"
fi
for t in "${TESTS[@]}"; do
  is_tp_test "$(basename "$t")" || gtest_step test "$t"
done

# ---------------------------------------------------------------------------------------------
# Tensor parallelism.
for t in "${TESTS[@]}"; do
  is_tp_test "$(basename "$t")" && gtest_step tp "$t"
done
TRANSPORT=mpi
[ "$GPUS" -ge 2 ] && TRANSPORT=nccl
TP_SCRIPT=$HERE/tp2_gpu_check.sh
T0=$(elapsed)
if [ "$GPUS" -eq 0 ]; then
  step tp tp2-mpirun skipped 0 "$NO_GPU_REASON"
elif [ "$MODE" = failed ]; then
  step tp tp2-mpirun skipped 0 "not built: the build failed"
elif ! command -v mpirun >/dev/null; then
  step tp tp2-mpirun skipped 0 "mpirun not found on this machine (Open MPI is not installed; not bundled)"
elif [ ! -x "$BIN/carpool-worker" ] || [ ! -x "$BIN/carpool-router" ] || [ ! -x "$BIN/carpool" ]; then
  step tp tp2-mpirun skipped 0 "carpool, carpool-router or carpool-worker not built (mode $MODE)"
elif [ "$(budget 180)" -lt 30 ]; then
  step tp tp2-mpirun skipped 0 "deadline: no time left"
else
  out=$(mktemp)
  run "tp2-mpirun ($TRANSPORT)" "$(budget 180)" bash -c \
    '"$@" >"'"$out"'" 2>&1; rc=$?; cat "'"$out"'"; exit $rc' _ "$TP_SCRIPT" "$BIN" "$ROOT" "$TRANSPORT"
  rc=$?
  last=$(grep -E "^(FAIL|skipped|ok)" "$out" | tail -1)
  rm -f "$out"
  case $rc in
    0) step tp tp2-mpirun passed $(($(elapsed) - T0)) "TP=2 over $TRANSPORT on $GPUS GPU(s): tokens equal TP=1 on the CPU" ;;
    77) step tp tp2-mpirun skipped $(($(elapsed) - T0)) "$last" ;;
    *) step tp tp2-mpirun failed $(($(elapsed) - T0)) "exit $rc over $TRANSPORT: ${last:-see gpu_checks.log}" ;;
  esac
fi

# ---------------------------------------------------------------------------------------------
# Benchmarks. bench_step NAME BASENAME SECONDS ARGS...: writes BASENAME.txt and BASENAME.json.
bench_step() {
  local name=$1 base=$2 seconds=$3
  shift 3
  local exe=$BIN/$name t0
  t0=$(elapsed)
  if [ "$GPUS" -eq 0 ]; then
    step bench "$name" skipped 0 "$NO_GPU_REASON"
    return
  fi
  [ "$MODE" = failed ] && { step bench "$name" skipped 0 "not built: the build failed"; return; }
  [ -x "$exe" ] || { step bench "$name" skipped 0 "not built in mode $MODE"; return; }
  seconds=$(budget "$seconds")
  [ "$seconds" -lt 10 ] && { step bench "$name" skipped 0 "deadline: no time left"; return; }
  local txt=$OUTDIR/$base.txt
  run "$name" "$seconds" bash -c '"$@" >"'"$txt"'" 2>&1; rc=$?; cat "'"$txt"'"; exit $rc' _ \
    "$exe" --json "$OUTDIR/$base.json" "$@"
  local rc=$?
  case $rc in
    0) step bench "$name" passed $(($(elapsed) - t0)) "$(grep -c . "$txt") lines in $base.txt" ;;
    77) step bench "$name" failed $(($(elapsed) - t0)) "a GPU is visible but it found no CUDA device" ;;
    124|137) step bench "$name" failed $(($(elapsed) - t0)) "timed out after ${seconds}s (rows so far in $base.txt)" ;;
    *) step bench "$name" failed $(($(elapsed) - t0)) "exit $rc: $(tail -1 "$txt")" ;;
  esac
}
bench_step carpool-bench-cuda-kernels cuda_kernels_bench 90
# shellcheck disable=SC2086
bench_step carpool-bench-gpu-model gpu_model_bench 240 ${CARPOOL_GPU_MODEL_BENCH_FLAGS:---presets 1b,8b --steps 10}

# ---------------------------------------------------------------------------------------------
# JSON and Markdown.
TOTAL=$(elapsed)
n_failed=0 n_passed=0 n_skipped=0
{
  printf '{\n  "date": "%s",\n  "host": "%s",\n  "gpu": "%s",\n  "gpus": %d,\n' \
    "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$(json_escape "$(hostname)")" "$(json_escape "$GPU")" "$GPUS"
  printf '  "no_gpu_reason": "%s",\n  "mode": "%s",\n  "commit": "%s",\n' \
    "$(json_escape "$NO_GPU_REASON")" "$MODE" \
    "$(json_escape "$( { [ "$MODE" = bundle ] && grep -m1 '^commit:' "$BUNDLE/MANIFEST" | cut -d' ' -f2-; } ||
      git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')")"
  printf '  "deadline_s": %d,\n  "total_s": %d,\n  "steps": [\n' "$DEADLINE_S" "$TOTAL"
  for i in "${!S_NAME[@]}"; do
    IFS='|' read -r p f s <<<"${S_COUNTS[$i]}"
    printf '    {"kind": "%s", "name": "%s", "status": "%s", "seconds": %s, "detail": "%s"' \
      "${S_KIND[$i]}" "${S_NAME[$i]}" "${S_STATUS[$i]}" "${S_SECONDS[$i]}" "$(json_escape "${S_DETAIL[$i]}")"
    [ -n "$p" ] && printf ', "tests_passed": %s, "tests_failed": %s, "tests_skipped": %s' "$p" "$f" "$s"
    printf '}%s\n' "$([ "$i" -lt $((${#S_NAME[@]} - 1)) ] && echo ,)"
  done
  printf '  ]\n}\n'
} >"$OUTDIR/gpu_checks.json"
for st in "${S_STATUS[@]}"; do
  case $st in failed) n_failed=$((n_failed + 1)) ;; passed) n_passed=$((n_passed + 1)) ;; *) n_skipped=$((n_skipped + 1)) ;; esac
done
{
  echo "# carpool GPU checks"
  echo ""
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), gpu: $GPU ($GPUS visible), mode: $MODE, total ${TOTAL}s of a ${DEADLINE_S}s deadline; $n_passed passed, $n_failed failed, $n_skipped skipped."
  [ -n "$NO_GPU_REASON" ] && echo "" && echo "$NO_GPU_REASON: every GPU step is skipped."
  echo ""
  echo "| kind | step | status | s | detail |"
  echo "| --- | --- | --- | ---: | --- |"
  for i in "${!S_NAME[@]}"; do
    echo "| ${S_KIND[$i]} | ${S_NAME[$i]} | ${S_STATUS[$i]} | ${S_SECONDS[$i]} | ${S_DETAIL[$i]//|/\\|} |"
  done
  for b in gpu_model_bench cuda_kernels_bench; do
    if [ -s "$OUTDIR/$b.txt" ]; then
      echo ""
      echo "## $b.txt"
      echo ""
      echo '```'
      head -80 "$OUTDIR/$b.txt"
      echo '```'
    fi
  done
} >"$OUTDIR/gpu_checks.md"
say ""
say "total ${TOTAL}s: $n_passed passed, $n_failed failed, $n_skipped skipped; $OUTDIR/gpu_checks.json, gpu_checks.md, gpu_checks.log"
exit "$FAILED"
