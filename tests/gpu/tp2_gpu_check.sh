#!/usr/bin/env bash
# tests/gpu/tp2_gpu_check.sh BIN_DIR SOURCE_DIR TRANSPORT
#
# TP=2 on GPUs with real processes (run_gpu_checks.sh's tensor-parallel step): one mpirun job of
# carpool-router + a TP-2 carpool-worker (cluster/launch/mpirun.sh, one-job layout) on
# synthetic:small in fp32 with --device cuda --tp-transport TRANSPORT (mpi: sums and logits
# staged through host memory over MPI, which is what one GPU allows, both ranks on it; nccl: on
# the devices' buffers, which needs a GPU per rank). Greedy tokens of two prompts through the
# router must equal those of TP=1 on the CPU in fp32 (`carpool generate --model`). Each rank
# takes --gpu-memory-utilization 0.4, so two ranks fit on one GPU.
#
# Exit status: 0 equal; 1 they differ or the cluster did not serve (logs printed); 77 skipped,
# with the reason on stdout (no mpirun, no python3). Environment: CARPOOL_TP2_DEVICE (default
# cuda; cpu checks this script's own plumbing on a machine without a GPU), CARPOOL_TP2_WAIT_S
# (seconds for the worker to register, default 120).
set -uo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 BIN_DIR SOURCE_DIR mpi|nccl" >&2
  exit 2
fi
bin=$1
src=$2
transport=$3
device=${CARPOOL_TP2_DEVICE:-cuda}
wait_s=${CARPOOL_TP2_WAIT_S:-120}
command -v mpirun >/dev/null || { echo "skipped: mpirun not found (Open MPI is not installed here)"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: python3 not found (needed to read the JSON)"; exit 77; }
for b in carpool carpool-router carpool-worker; do
  [ -x "$bin/$b" ] || { echo "$bin/$b is missing"; exit 1; }
done
work=$(mktemp -d /tmp/carpool_tp2_gpu.XXXXXX)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launcher_pid=0

cleanup() {
  if [ "$launcher_pid" -gt 0 ]; then
    kill -TERM "$launcher_pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do kill -0 "$launcher_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$launcher_pid" 2>/dev/null
  fi
  # Every rank the launcher's log announced.
  for p in $(grep -ho "(pid [0-9]*)" "$work"/*.log 2>/dev/null | tr -dc '0-9\n'); do
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do echo "--- $f"; tail -40 "$f"; done
  exit 1
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
workers() {  # how many workers the router lists; -1 when it does not answer
  "$bin/carpool" status --router "$1" --json --timeout-ms 1000 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["workers"]))' 2>/dev/null || echo -1
}
tokens() {  # WHERE PROMPT_IDS: greedy tokens from router WHERE, or TP=1 on the CPU for "local"
  local where=(--router "$1")
  [ "$1" = local ] && where=(--model synthetic:small --device cpu --dtype float32 --max-model-len 1024)
  "$bin/carpool" generate "${where[@]}" --prompt-ids "$2" --max-tokens 12 --temperature 0 \
    --ignore-eos --json 2>>"$work/generate.log" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])' 2>>"$work/generate.log"
}

prompts=(256,7,8,9 256,1000,2000,3000,4000,5000)
declare -a expected=()
for p in "${prompts[@]}"; do
  t=$(tokens local "$p")
  [ -n "$t" ] || fail "TP=1 on the CPU gave no tokens for $p"
  expected+=("$t")
done

port=$(free_port)
front="tcp://127.0.0.1:$port"
echo "TP=2 on $device, --tp-transport $transport: router + one TP-2 worker at $front"
"$src/cluster/launch/mpirun.sh" --bin "$bin" --model synthetic:small --workers 1 --tp 2 \
  --frontend "$front" --oversubscribe -- --device "$device" --dtype float32 \
  --tp-transport "$transport" --max-model-len 1024 --gpu-memory-utilization 0.4 \
  >"$work/cluster.log" 2>&1 &
launcher_pid=$!
start=$(date +%s)
while [ "$(workers "$front")" != 1 ]; do
  kill -0 "$launcher_pid" 2>/dev/null || fail "the cluster exited before its worker registered"
  [ $(($(date +%s) - start)) -ge "$wait_s" ] && fail "no worker registered within ${wait_s}s"
  sleep 0.2
done
echo "worker registered after $(($(date +%s) - start))s"
for i in "${!prompts[@]}"; do
  got=$(tokens "$front" "${prompts[$i]}")
  [ "$got" = "${expected[$i]}" ] ||
    fail "prompt ${prompts[$i]}: TP=2 on $device gave '$got', TP=1 on the CPU '${expected[$i]}'"
  echo "prompt ${prompts[$i]}: TP=2 tokens equal TP=1's on the CPU: $got"
done
echo "ok"
exit 0
