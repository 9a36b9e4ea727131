#!/usr/bin/env bash
# Installs the official OpenAI Node SDK (the `openai` npm package, pinned) into DIR, a folder the
# batch tests own under the build directory, with npm's cache inside it. 6.49.0 is the version
# tests/tokenizer/npm_setup.sh pins for the chat end-to-end test (its last release that runs on
# Node 20), so both tests check one SDK. Idempotent: nothing to do when DIR holds that version.
#
# Exit status: 0 installed (or already there); 77 npm cannot reach its registry (the caller
# reports the test skipped with the printed reason); anything else is a real failure.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
DIR=$1
VERSION=6.49.0

installed_version() {
  local pj="$DIR/node_modules/openai/package.json"
  [[ -f "$pj" ]] || return 0
  sed -n 's/^[[:space:]]*"version"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$pj" | head -n1
}

if [[ "$(installed_version)" == "$VERSION" ]]; then
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
     "openai@$VERSION" >"$LOG" 2>&1; then
  if [[ "$(installed_version)" == "$VERSION" ]]; then
    exit 0
  fi
  echo "npm install finished but openai@$VERSION is not in $DIR/node_modules:" >&2
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
