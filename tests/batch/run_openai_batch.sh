#!/usr/bin/env bash
# The ctest entry of the OpenAI Node SDK batch test (openai_sdk_e2e.py driving openai_batch.mjs):
#   run_openai_batch.sh BUILD_DIR [pytest args...]
# Installs the pinned openai npm package into BUILD_DIR/batch-npm (npm_setup.sh; exit 77, which
# ctest reports as a skip, only when npm cannot reach its registry), then runs the test against
# BUILD_DIR/bin's carpool-router and carpool-worker.
set -uo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [pytest args...]" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd)
shift
HERE=$(cd "$(dirname "$0")" && pwd)

bash "$HERE/npm_setup.sh" "$BUILD_DIR/batch-npm"
rc=$?
if [[ $rc -eq 77 ]]; then
  echo "SKIPPED: npm cannot reach its registry, so the openai package is not installed" >&2
  exit 77
elif [[ $rc -ne 0 ]]; then
  exit "$rc"
fi

PYTHON=/usr/bin/python3
[[ -x $PYTHON ]] || PYTHON=python3
export CARPOOL_BATCH_NPM_DIR="$BUILD_DIR/batch-npm"
export CARPOOL_BIN_DIR="$BUILD_DIR/bin"
export PYTHONDONTWRITEBYTECODE=1
exec "$PYTHON" -m pytest "$HERE/openai_sdk_e2e.py" -q -p no:cacheprovider --tb=short "$@"
