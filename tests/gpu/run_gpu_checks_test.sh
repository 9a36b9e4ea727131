#!/usr/bin/env bash
# tests/gpu/run_gpu_checks_test.sh BUILD_DIR SOURCE_DIR (ctest carpool_gpu_checks_cpu, label
# unit): keeps the one-call GPU check honest on a machine without a GPU. With the GPU hidden
# (CUDA_VISIBLE_DEVICES empty, so this holds on a GPU machine too) run_gpu_checks.sh must exit 0
# within 60 s and write gpu_checks.json and gpu_checks.md listing, as skipped with a reason: the
# build, every gpu-labelled test binary that `ctest -N -L gpu` lists for BUILD_DIR (none
# missing, none extra), tp2-mpirun and both benchmarks. Where carpool-bench-gpu-model is built,
# it must exit 77 saying no CUDA device is visible and write a JSON that says skipped.
set -uo pipefail
build=$1
src=$2
work=$(mktemp -d /tmp/carpool_gpu_checks_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -f "$work/out/gpu_checks.log" ] && tail -40 "$work/out/gpu_checks.log"; exit 1; }

start=$(date +%s)
CUDA_VISIBLE_DEVICES= CARPOOL_BUILD_DIR="$build" CARPOOL_GPU_BUNDLE="$work/no-bundle" \
  timeout 60 "$src/tests/gpu/run_gpu_checks.sh" "$work/out" >"$work/stdout" 2>&1
rc=$?
cat "$work/stdout"
[ $rc -eq 0 ] || fail "run_gpu_checks.sh exited $rc without a GPU (want 0)"
[ -s "$work/out/gpu_checks.md" ] || fail "no gpu_checks.md"
echo "run_gpu_checks.sh: exit 0 after $(($(date +%s) - start))s"

ctest --test-dir "$build" -N -V -L gpu 2>/dev/null | awk '/Test command:/ {print $4}' |
  xargs -r -n1 basename | sort -u >"$work/expected"
echo "gpu-labelled binaries in $build: $(wc -l <"$work/expected")"
/usr/bin/python3 - "$work/out/gpu_checks.json" "$work/expected" <<'EOF' || fail "gpu_checks.json"
import json, sys
doc = json.load(open(sys.argv[1]))
expected = set(open(sys.argv[2]).read().split())
steps = doc["steps"]
names = [s["name"] for s in steps]
problems = []
if doc["gpus"] != 0 or not doc["no_gpu_reason"]:
    problems.append(f"gpus {doc['gpus']}, no_gpu_reason {doc['no_gpu_reason']!r}")
for s in steps:
    if s["status"] != "skipped" or not s["detail"]:
        problems.append(f"step {s['name']}: {s['status']} {s['detail']!r} (want skipped, with a reason)")
tests = {s["name"] for s in steps if s["kind"] in ("test", "tp") and s["name"] != "tp2-mpirun"}
if expected and tests != expected:
    problems.append(f"test steps {sorted(tests)} != ctest -L gpu {sorted(expected)}")
for required in ["build", "tp2-mpirun", "carpool-bench-cuda-kernels", "carpool-bench-gpu-model"]:
    if required not in names:
        problems.append(f"no step {required}")
order = [s["kind"] for s in steps]
if order != sorted(order, key=["build", "test", "tp", "bench"].index):
    problems.append(f"steps out of order: {order}")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"gpu_checks.json: {len(steps)} steps, all skipped with a reason, {len(tests)} test binaries")
EOF

bench=$build/bin/carpool-bench-gpu-model
if [ -x "$bench" ]; then
  CUDA_VISIBLE_DEVICES= timeout 30 "$bench" --json "$work/model.json" >"$work/bench.txt" 2>&1
  rc=$?
  [ $rc -eq 77 ] || fail "carpool-bench-gpu-model exited $rc without a GPU (want 77): $(cat "$work/bench.txt")"
  grep -q "no CUDA device" "$work/bench.txt" || fail "carpool-bench-gpu-model did not say why it skipped"
  grep -q '"skipped"' "$work/model.json" || fail "carpool-bench-gpu-model's JSON does not say skipped"
  echo "carpool-bench-gpu-model: exit 77, $(cat "$work/bench.txt")"
fi
echo "ok"
