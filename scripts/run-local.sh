#!/usr/bin/env bash
# `make run`: a first look at carpool on the built-in synthetic model.
set -euo pipefail
build=${1:-build}
echo "== carpool generate on synthetic:tiny (greedy, 32 tokens)"
"$build/bin/carpool" generate --model synthetic:tiny --prompt "hello, carpool" \
  --max-tokens 32 --temperature 0 --json
echo "== offline batch mode: three prompts through one engine"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
printf '%s\n' '{"prompt": "the first rider"}' '{"prompt": "a second one", "max_tokens": 8}' \
  '{"prompt_ids": [256, 104, 105], "temperature": 0.8, "seed": 7}' > "$tmp"
"$build/bin/carpool" generate --model synthetic:tiny --prompts-file "$tmp" --json
