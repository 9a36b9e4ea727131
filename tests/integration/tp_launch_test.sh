#!/usr/bin/env bash
# cluster/launch/mpirun.sh in both layouts (ctest label mpi):
#   one job:         router + one TP-2 worker serve; Ctrl-C on the script ends every rank.
#   router outside:  router + two TP-2 groups; a killed rank takes down only its group, which
#                    the script starts again; SIGTERM on the script ends everything.
# Usage: tp_launch_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
bin="$1"
src="$2"
launch="$src/cluster/launch/mpirun.sh"
work="$(mktemp -d /tmp/carpool_tp_launch.XXXXXX)"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
script_pid=0

fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log; do echo "--- $f" >&2; tail -40 "$f" >&2; done
  exit 1
}
cleanup() {
  [ "$script_pid" -gt 0 ] && kill -TERM "$script_pid" 2>/dev/null || true
  sleep 1
  # Every rank the logs announced, whatever happened.
  for p in $(grep -ho "(pid [0-9]*)" "$work"/*.log 2>/dev/null | tr -dc '0-9\n'); do
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
alive() { [ -d "/proc/$1" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }

workers() {  # how many workers the router lists; -1 when it does not answer
  "$bin/carpool" status --router "$1" --json --timeout-ms 1000 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["workers"]))' 2>/dev/null || echo -1
}
wait_workers() {  # ENDPOINT N SECONDS
  for ((i = 0; i < $3 * 10; i++)); do
    [ "$(workers "$1")" = "$2" ] && return 0
    sleep 0.1
  done
  fail "the router at $1 never listed $2 workers (now $(workers "$1"))"
}
tokens() {  # the greedy tokens for prompt $2 from router $1 (or in process with "local")
  local where=(--router "$1")
  [ "$1" = local ] && where=(--model synthetic:tiny --max-model-len 1024)
  "$bin/carpool" generate "${where[@]}" --prompt-ids "$2" --max-tokens 12 --temperature 0 \
    --ignore-eos --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])'
}
rank_pids() { grep -ho "(pid [0-9]*), worker" "$1" | tr -dc '0-9\n'; }
expect_gone() {  # LOG SECONDS: every pid the log announced has exited
  for ((i = 0; i < $2 * 10; i++)); do
    local left=0
    for p in $(grep -ho "(pid [0-9]*)" "$1" | tr -dc '0-9\n'); do alive "$p" && left=1; done
    [ "$left" -eq 0 ] && return 0
    sleep 0.1
  done
  fail "processes of $1 still running"
}

expected="$(tokens local 256,7,8,9)"

echo "== one job: router + 1 TP-2 worker"
port=$(free_port)
front="tcp://127.0.0.1:$port"
"$launch" --bin "$bin" --model synthetic:tiny --workers 1 --tp 2 --frontend "$front" \
  --oversubscribe -- --threads 1 --max-model-len 1024 >"$work/one.log" 2>&1 &
script_pid=$!
wait_workers "$front" 1 60
[ "$(tokens "$front" 256,7,8,9)" = "$expected" ] || fail "one job: tokens differ from TP=1"
kill -INT "$script_pid"  # Ctrl-C
for ((i = 0; i < 150 && $(kill -0 "$script_pid" 2>/dev/null && echo 1 || echo 0); i++)); do
  sleep 0.1
done
kill -0 "$script_pid" 2>/dev/null && fail "one job: mpirun still running 15 s after Ctrl-C"
script_pid=0
expect_gone "$work/one.log" 5
echo "one job: served, Ctrl-C ended every rank"

echo "== router outside: router + 2 TP-2 groups, one rank killed"
front="tcp://127.0.0.1:$(free_port)"
back="tcp://127.0.0.1:$(free_port)"
"$launch" --bin "$bin" --model synthetic:tiny --workers 2 --tp 2 --frontend "$front" \
  --backend "$back" --router-outside --oversubscribe -- --threads 1 --max-model-len 1024 \
  >"$work/outside.log" 2>&1 &
script_pid=$!
wait_workers "$front" 2 60
[ "$(tokens "$front" 256,7,8,9)" = "$expected" ] || fail "router outside: tokens differ"
victim=$(rank_pids "$work/outside.log" | head -1)
[ -n "$victim" ] || fail "no rank pid in the log"
kill -KILL "$victim"
wait_workers "$front" 1 5  # the router dropped the broken group ...
[ "$(tokens "$front" 256,7,8,9)" = "$expected" ] || fail "the surviving group does not serve"
wait_workers "$front" 2 60  # ... and the script started it again
grep -q "starting it again" "$work/outside.log" || fail "no restart logged"
[ "$(tokens "$front" 256,7,8,9)" = "$expected" ] || fail "after the restart: tokens differ"
kill -TERM "$script_pid"
wait "$script_pid" || true
script_pid=0
expect_gone "$work/outside.log" 10
echo "router outside: a killed rank cost one group for a moment; SIGTERM ended everything"
echo PASS
