#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into OUT_DIR and fuzzes the frame
# decoder and request validator for SECONDS, starting from the seed corpus.
#   run_fuzz.sh OUT_DIR SECONDS
# Exit 77 (reported as skipped by CTest) when no clang with libFuzzer is available.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
out="$1"
seconds="$2"
mkdir -p "$out"
clang=""
for c in clang++ clang++-14 clang++-15 clang++-16; do
  if command -v "$c" >/dev/null 2>&1; then clang="$(command -v "$c")"; break; fi
done
if [ -z "$clang" ]; then
  echo "fuzz: no clang++ found; skipped (scripts/install-deps.sh installs it)"
  exit 77
fi
probe="$out/probe.cc"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$probe"
if ! "$clang" -fsanitize=fuzzer,address,undefined "$probe" -o "$out/probe" 2>/dev/null; then
  echo "fuzz: $clang cannot link -fsanitize=fuzzer (libclang-rt missing?); skipped"
  exit 77
fi
cmake -S "$src/router/fuzz" -B "$out" -G Ninja -DCMAKE_CXX_COMPILER="$clang" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCARPOOL_SOURCE_DIR="$src" >/dev/null
cmake --build "$out" -j"${JOBS:-2}" >/dev/null
corpus="$out/corpus"
mkdir -p "$corpus"
cp "$src"/router/fuzz/corpus/* "$corpus"/
echo "fuzz: carpool_fuzz_frames for ${seconds}s"
# Memory and time per input are bounded; any crash, leak or UBSan report fails the run.
"$out/carpool_fuzz_frames" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 "$corpus" 2>&1 | tail -n 25
exit "${PIPESTATUS[0]}"
