# Sourced by the ctest entries that use the npm reference (tests/tokenizer: run_tests.sh,
# run_cluster_text.sh; tests/chat_template: run_tests.sh, run_e2e_openai.sh).

# Installs the reference library and tokenizer files into DIR with npm_setup.sh; exits the
# calling script with 77 (a ctest skip) when npm cannot reach its registry, and with npm_setup's
# status on any other failure.
install_reference_or_skip() {
  "$(dirname "${BASH_SOURCE[0]}")/npm_setup.sh" "$1"
  local rc=$?
  if [[ $rc -eq 77 ]]; then
    echo "SKIPPED: npm cannot reach its registry, so the reference tokenizer library is not installed" >&2
    exit 77
  elif [[ $rc -ne 0 ]]; then
    exit "$rc"
  fi
}

# Debian's python3 (numpy, zmq, pytest), or whatever python3 there is.
PYTHON=/usr/bin/python3
[[ -x $PYTHON ]] || PYTHON=python3

# Runs one cluster test file (named so that a pytest run over its folder does not collect it: it
# needs this environment) against BUILD_DIR's binaries, after installing the npm reference into
# BUILD_DIR/tokenizer-npm:
#   run_cluster_pytest BUILD_DIR TEST_FILE [pytest args...]
run_cluster_pytest() {
  local build_dir=$1 test_file=$2
  shift 2
  local repo
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  install_reference_or_skip "$build_dir/tokenizer-npm"
  export CARPOOL_TOKENIZER_NPM_DIR="$build_dir/tokenizer-npm"
  export CARPOOL_BIN_DIR="$build_dir/bin"
  export PYTHONPATH="$repo/client/python:$build_dir/client/python${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONDONTWRITEBYTECODE=1
  exec "$PYTHON" -m pytest "$test_file" -q -p no:cacheprovider --tb=short "$@"
}
