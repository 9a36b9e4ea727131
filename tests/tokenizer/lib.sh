# Sourced by the tokenizer tests' ctest entries (run_tests.sh, run_cluster_text.sh).

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
