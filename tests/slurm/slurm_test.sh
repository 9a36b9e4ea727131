#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, started and stopped by the test (ctest label slurm):
# munged, slurmctld and slurmd on localhost with their configuration and state in a temporary
# folder. Submits cluster/slurm/carpool.sbatch (CPU workers, synthetic:tiny, one TP-2 worker),
# sends requests to the router the job started, checks the answers against the model run in
# process, cancels the job and stops the daemons. Exits 77 (ctest: skipped) with the reason when
# the Slurm or munge packages are missing (scripts/install-deps.sh installs them).
# Usage: slurm_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin="$1"
src="$2"

skip() {
  echo "SKIPPED: $*"
  exit 77
}
for tool in munged slurmctld slurmd sbatch squeue scancel sinfo; do
  command -v "$tool" >/dev/null || skip "$tool not found (Debian packages munge slurmctld slurmd slurm-client)"
done

work="$(mktemp -d /tmp/carpool_slurm.XXXXXX)"
chmod 755 "$work"
node="$(hostname -s)"
job=""

log_tail() {
  for f in "$work"/*.log "$work"/run/*.log "$work"/job.out; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -30 "$f" >&2; }
  done
  return 0
}
fail() {
  echo "FAIL: $*" >&2
  log_tail
  exit 1
}
stop_pidfile() {
  local f="$1"
  [ -f "$f" ] || return 0
  local p
  p="$(cat "$f")"
  kill -TERM "$p" 2>/dev/null || return 0
  for ((i = 0; i < 50; i++)); do
    kill -0 "$p" 2>/dev/null || return 0
    grep -q '^[0-9]* ([^)]*) Z' "/proc/$p/stat" 2>/dev/null && return 0
    sleep 0.1
  done
  kill -KILL "$p" 2>/dev/null || true
}
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  sleep 1
  stop_pidfile "$work/slurmd.pid"
  stop_pidfile "$work/slurmctld.pid"
  stop_pidfile "$work/munge/munged.pid"
  # Anything the job left (it should have left nothing).
  for p in $(grep -ho "(pid [0-9]*)" "$work"/run/*.log "$work"/job.out 2>/dev/null | tr -dc '0-9\n'); do
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# munge: a fresh key and socket of our own.
mkdir -p "$work/munge" "$work/state" "$work/spool" "$work/run"
chmod 755 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
munged --force --key-file="$work/munge/munge.key" --socket="$work/munge/munge.sock" \
  --log-file="$work/munge.log" --pid-file="$work/munge/munged.pid" \
  --seed-file="$work/munge/munged.seed" || skip "munged cannot start here (see $work/munge.log)"

export SLURM_CONF="$work/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=carpooltest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
slurmctld -f "$SLURM_CONF" -i || skip "slurmctld cannot start here (see $work/slurmctld.log)"
slurmd -f "$SLURM_CONF" -N "$node" || skip "slurmd cannot start here (see $work/slurmd.log)"
for ((i = 0; i < 300; i++)); do
  [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break
  sleep 0.1
done
[ "$(sinfo -h -o %T)" = idle ] || skip "the Slurm node never became idle: $(sinfo -h -o '%T %E' 2>&1)"
echo "slurm: slurmctld, slurmd and munged up on $node"

port=$(free_port)
export CARPOOL_MODEL=synthetic:tiny CARPOOL_TP=2 CARPOOL_BIN="$bin" CARPOOL_RUN_DIR="$work/run"
export CARPOOL_FRONTEND="tcp://127.0.0.1:$port" CARPOOL_BACKEND_PORT="$(free_port)"
export CARPOOL_WORKER_FLAGS="--threads 1 --max-model-len 1024"
export CARPOOL_MPIRUN_FLAGS="--oversubscribe --mca btl_vader_single_copy_mechanism none"
job=$(sbatch --parsable --nodes=1 --ntasks-per-node=2 --output="$work/job.out" \
  "$src/cluster/slurm/carpool.sbatch") || fail "sbatch refused the job"
echo "slurm: submitted job $job"

workers() {
  "$bin/carpool" status --router "$CARPOOL_FRONTEND" --json --timeout-ms 1000 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["workers"]))' 2>/dev/null || echo -1
}
for ((i = 0; i < 600; i++)); do
  [ "$(workers)" = 1 ] && break
  sleep 0.1
done
[ "$(workers)" = 1 ] || fail "the job's router never listed its worker (job: $(squeue -h -j "$job" -o %T))"
[ "$(cat "$work/run/router.endpoint")" = "$CARPOOL_FRONTEND" ] || fail "router.endpoint"
echo "slurm: job $job is $(squeue -h -j "$job" -o %T); its router lists 1 TP-2 worker"

# The group's GPUs: named by --gpus (ordinals into what the ranks see), CUDA_VISIBLE_DEVICES as
# the job had it (here as this shell has it), not replaced by slot numbers.
want_cvd="${CUDA_VISIBLE_DEVICES-<unset>}"
ranks_seen=0
for p in $(grep -ho "(pid [0-9]*), worker" "$work"/run/worker*.log | tr -dc '0-9\n'); do
  [ -r "/proc/$p/cmdline" ] || continue
  tr '\0' ' ' <"/proc/$p/cmdline" | grep -q -- "--gpus 0,1" ||
    fail "worker rank $p was not started with --gpus 0,1: $(tr '\0' ' ' <"/proc/$p/cmdline")"
  got_cvd="$(tr '\0' '\n' <"/proc/$p/environ" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')"
  grep -q '^CUDA_VISIBLE_DEVICES=' <(tr '\0' '\n' <"/proc/$p/environ") || got_cvd="<unset>"
  [ "$got_cvd" = "$want_cvd" ] ||
    fail "worker rank $p sees CUDA_VISIBLE_DEVICES=$got_cvd, the job had $want_cvd"
  ranks_seen=$((ranks_seen + 1))
done
[ "$ranks_seen" -eq 2 ] || fail "found $ranks_seen worker ranks in the logs, want 2"
echo "slurm: both ranks run with --gpus 0,1 and the job's CUDA_VISIBLE_DEVICES ($want_cvd)"

for prompt in 256,1,2,3 256,72,101,108,108,111 256,200,13; do
  local_tokens=$("$bin/carpool" generate --model synthetic:tiny --max-model-len 1024 \
    --prompt-ids "$prompt" --max-tokens 16 --temperature 0 --ignore-eos --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
  job_tokens=$("$bin/carpool" generate --router "$CARPOOL_FRONTEND" --prompt-ids "$prompt" \
    --max-tokens 16 --temperature 0 --ignore-eos --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])') ||
    fail "no answer for $prompt"
  [ "$job_tokens" = "$local_tokens" ] || fail "prompt $prompt: job $job_tokens, in process $local_tokens"
done
echo "slurm: 3 greedy answers equal the model run in process"

scancel "$job"
for ((i = 0; i < 300; i++)); do
  [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break
  sleep 0.1
done
[ -z "$(squeue -h -j "$job" 2>/dev/null)" ] || fail "job $job still listed 30 s after scancel"
for p in $(grep -ho "(pid [0-9]*)" "$work"/run/*.log "$work/job.out" | tr -dc '0-9\n'); do
  for ((i = 0; i < 100; i++)); do
    [ -d "/proc/$p" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$p/stat" 2>/dev/null || break
    sleep 0.1
  done
  [ -d "/proc/$p" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$p/stat" 2>/dev/null &&
    fail "process $p of the job outlived scancel"
done
job=""
echo "slurm: scancel ended the job; no process left"
echo PASS
