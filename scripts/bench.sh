#!/usr/bin/env bash
# `make bench`: the engine benchmark on synthetic:small. Figures go to docs/PERFORMANCE.md.
set -euo pipefail
build=${1:-build}
"$build/bin/carpool-bench-engine" --model synthetic:small "${@:2}"
