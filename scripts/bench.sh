#!/usr/bin/env bash
# `make bench [SCENARIO=a,c]`: the benchmark suite (bench/run_suite.py). It starts its own router
# and workers from BUILD/bin on free 127.0.0.1 ports and rewrites the suite's sections of
# docs/PERFORMANCE.md and its plots in docs/img/.
#   scripts/bench.sh [BUILD] [SCENARIOS]     BUILD defaults to build, SCENARIOS to all (a..i)
set -euo pipefail
build=${1:-build}
scenarios=${2:-abcdefghi}
cd "$(dirname "$0")/.."
# The plots need matplotlib: Debian's python3-matplotlib (scripts/install-deps.sh) lives in the
# system interpreter, which a python3 earlier on PATH (pyenv, a venv) may not see.
python=python3
if ! "$python" -c 'import matplotlib' 2>/dev/null && [ -x /usr/bin/python3 ] &&
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  python=/usr/bin/python3
fi
exec "$python" bench/run_suite.py --build "$build" --scenarios "$scenarios"
