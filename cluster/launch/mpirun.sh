#!/usr/bin/env bash
# Launches a carpool cluster with Open MPI's mpirun (docs/cluster.md, "Launching with mpirun").
#
#   cluster/launch/mpirun.sh --model DIR [--workers N] [--tp N] [--hostfile FILE] [options]
#                            [-- extra carpool-worker flags]
#
# Two layouts:
#   one job (default)   mpirun -np 1 carpool-router : -np N*TP carpool-worker --tp TP ...
#                       The router is rank 0 and the workers find it over MPI. Open MPI ends the
#                       whole job when any rank dies, so one dead rank stops the cluster; this
#                       script then exits with mpirun's status, for a supervisor to restart.
#   --router-outside    The router runs here as a plain process; every tensor-parallel group is
#                       its own `mpirun -np TP` job with --router. A dead rank ends only its
#                       group's job (carpool's group watch ends the group's other ranks within
#                       about a second); the router drops that worker and keeps serving with the
#                       others, and this script starts the group again (--restarts times).
#
# Ctrl-C (SIGINT) or SIGTERM to this script stops every process it started.
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  cat <<'EOF'
options:
  --model SPEC          synthetic:<preset> or a Hugging Face folder (required)
  --workers N           tensor-parallel groups, i.e. workers the router sees (default 1)
  --tp N                ranks per worker (default 1)
  --frontend ENDPOINT   where clients connect (default tcp://127.0.0.1:5555)
  --backend ENDPOINT    --router-outside: where workers connect (default tcp://<host>:5556;
                        one job: chosen by the router and sent over MPI)
  --hostfile FILE       Open MPI hostfile ("host slots=N" lines) for several nodes;
                        --router-outside places the groups with cluster/launch/plan.py
                        (TP slots of one host each; `plan.py --hostfile FILE --tp N` prints it)
  --router-outside      the resilient layout above
  --restarts N          --router-outside: times a failed group is started again (default 3)
  --oversubscribe       allow more ranks than cores (tests, laptops)
  --bin DIR             carpool binaries (default: build/bin of this checkout)
  --dry-run             print the commands instead of running them
EOF
}

here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$here/../.." && pwd)/build/bin"
model="" workers=1 tp=1 frontend="tcp://127.0.0.1:5555" backend="" hostfile=""
outside=0 restarts=3 dry=0
mpi_flags=(--bind-to none)  # a CPU rank's kernel threads may use every core
worker_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --tp) tp="$2"; shift 2 ;;
    --frontend) frontend="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --hostfile) hostfile="$2"; shift 2 ;;
    --router-outside) outside=1; shift ;;
    --restarts) restarts="$2"; shift 2 ;;
    --oversubscribe) mpi_flags+=(--oversubscribe); shift ;;
    --bin) bin="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; worker_extra=("$@"); break ;;
    *) echo "mpirun.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "mpirun.sh: --model is required" >&2; exit 2; }
# Containers often run as root; Open MPI refuses root unless told.
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
mpirun="${MPIRUN:-mpirun}"

run() {
  if [ "$dry" -eq 1 ]; then echo "$*"; else "$@"; fi
}

if [ "$outside" -eq 0 ]; then
  [ -n "$hostfile" ] && mpi_flags+=(--hostfile "$hostfile")
  cmd=("$mpirun" "${mpi_flags[@]}"
       -np 1 "$bin/carpool-router" --frontend "$frontend"
       : -np $((workers * tp)) "$bin/carpool-worker" --tp "$tp" --model "$model"
       "${worker_extra[@]}")
  if [ "$dry" -eq 1 ]; then echo "${cmd[*]}"; exit 0; fi
  # mpirun itself turns Ctrl-C / SIGTERM into SIGTERM to every rank (SIGKILL a second later).
  exec "${cmd[@]}"
fi

# --router-outside: the router here, one mpirun job per group, each restarted on failure. Where
# each group goes comes from plan.py (hostfile slots, or this host with WORKERS*TP slots).
if [ -z "$backend" ]; then
  address=127.0.0.1
  [ -n "$hostfile" ] && address="$(hostname -I 2>/dev/null | awk '{print $1}')"
  backend="tcp://${address:-127.0.0.1}:5556"
fi
plan_args=(--tp "$tp" --workers "$workers" --model "$model" --bin "$bin" --frontend "$frontend"
           --backend "$backend")
address="${backend#tcp://}"
plan_args+=(--router-address "${address%:*}")
if [ -n "$hostfile" ]; then
  plan_args+=(--hostfile "$hostfile")
else
  plan_args+=(--hosts "$(hostname):$((workers * tp))")
fi
plan="$(python3 "$here/plan.py" "${plan_args[@]}" --format sh)" || exit 2
pids=()
stop() {
  trap - INT TERM EXIT
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

# The plan's router (its first host: run this script there when a hostfile names others).
eval "router_cmd=($(sed -n 's/^router [^ ]* - 1 //p' <<<"$plan"))"
if [ "$dry" -eq 1 ]; then
  run "${router_cmd[@]}"
else
  "${router_cmd[@]}" &
  pids+=($!)
fi

# Group g is the plan's g-th worker: `mpirun --host HOST:TP` (no --host without a hostfile). Its
# command names its GPUs (--gpu K, or --gpus for a group: each rank takes its local rank's entry)
# as ordinals into the GPUs the ranks see; CUDA_VISIBLE_DEVICES stays as the host set it (on a
# shared node the job's GPUs), so no -x of it here.
group() {
  local g=$1 host=$2 ranks=$4 flags=("${mpi_flags[@]}")
  shift 4
  [ -n "$hostfile" ] && flags+=(--host "$host:$ranks")
  local left=$restarts child=0 status
  # stop() signals this subshell; pass it on to the group's mpirun (which drains the leader).
  trap 'kill -TERM $child 2>/dev/null; wait $child; exit 0' INT TERM
  local cmd=("$mpirun" "${flags[@]}" -np "$ranks" "$@" "${worker_extra[@]}")
  if [ "$dry" -eq 1 ]; then echo "${cmd[*]}"; return 0; fi
  while :; do
    set +e
    "${cmd[@]}" &
    child=$!
    wait $child
    status=$?
    set -e
    if [ $status -eq 0 ] || [ "$left" -le 0 ]; then return $status; fi
    left=$((left - 1))
    echo "mpirun.sh: group $g ended with status $status; starting it again ($left restarts left)" >&2
    sleep 1
  done
}
g=0
while read -r role host gpus ranks cmd; do
  [ "$role" = worker ] || continue
  eval "argv=($cmd)"
  if [ "$dry" -eq 1 ]; then
    group "$g" "$host" "$gpus" "$ranks" "${argv[@]}"
  else
    group "$g" "$host" "$gpus" "$ranks" "${argv[@]}" &
    pids+=($!)
  fi
  g=$((g + 1))
done <<<"$plan"
[ "$dry" -eq 1 ] && exit 0
# Runs until the router exits (or a signal arrives); the groups follow it.
wait "${pids[0]}"
