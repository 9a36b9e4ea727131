#!/usr/bin/env bash
# `make run`: a local carpool cluster on 127.0.0.1: one router and two workers serving the
# built-in synthetic:small model. Serves until Ctrl-C, then stops every process it started.
# CARPOOL_FRONTEND_PORT / CARPOOL_BACKEND_PORT / CARPOOL_HTTP_PORT / CARPOOL_MODEL override the
# defaults (5555, 5556, 8000, synthetic:small).
set -euo pipefail
build=${1:-build}
bin="$build/bin"
frontend_port=${CARPOOL_FRONTEND_PORT:-5555}
backend_port=${CARPOOL_BACKEND_PORT:-5556}
http_port=${CARPOOL_HTTP_PORT:-8000}
model=${CARPOOL_MODEL:-synthetic:small}
frontend="tcp://127.0.0.1:$frontend_port"
backend="tcp://127.0.0.1:$backend_port"
logs=$(mktemp -d /tmp/carpool-run.XXXXXX)
pids=()

stopping=0
stop_all() {
  trap - INT TERM EXIT
  stopping=1
  echo
  echo "stopping carpool (logs in $logs)"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap stop_all INT TERM EXIT

# Batch jobs live in the build folder, so they outlast a restart of `make run`.
"$bin/carpool-router" --frontend "$frontend" --backend "$backend" --http "127.0.0.1:$http_port" \
  --state-dir "$build/carpool-state" >"$logs/router.log" 2>&1 &
pids+=($!)
# On a machine with an NVIDIA GPU the workers run on it (--device auto); the two share it, so
# each sizes its KV cache from 40% of its memory instead of 90%.
device_args=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  device_args=(--gpu-memory-utilization 0.4)
fi
for i in 1 2; do
  "$bin/carpool-worker" --router "$backend" --model "$model" --worker-id "worker-$i" \
    --threads 1 "${device_args[@]}" >"$logs/worker-$i.log" 2>&1 &
  pids+=($!)
done

# Ready when both workers are registered.
for _ in $(seq 600); do
  if [ "$(grep -c 'registered' "$logs/router.log" 2>/dev/null || true)" -ge 2 ]; then break; fi
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "a carpool process exited early; logs:"; tail -n 20 "$logs"/*.log; exit 1
    fi
  done
  sleep 0.1
done

cat <<EOF2
carpool is up: model $model, one router, two workers
  clients connect to  $frontend
  workers connect to  $backend
  OpenAI API          http://127.0.0.1:$http_port/v1  (metrics: /metrics)
  logs                $logs

try, in another terminal:
  $bin/carpool generate --router $frontend --prompt "hello, carpool" --max-tokens 32 --json
  $bin/carpool embed --router $frontend --input "hello" --input "carpool" --json
  $bin/carpool status --router $frontend
  $bin/carpool batch submit --router $frontend requests.jsonl --wait   (docs/batch.md)
  curl -s 127.0.0.1:$http_port/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}'

Ctrl-C stops the cluster.
EOF2
wait -n "${pids[@]}" || true
if [ "$stopping" -eq 0 ]; then echo "a carpool process exited; see $logs"; fi
