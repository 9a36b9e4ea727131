#!/usr/bin/env bash
# tests/gpu/make_gpu_bundle.sh [DIR [BUILD_DIR]]
#
# Builds the GPU tests and benchmarks of the full project here (where every build dependency is
# installed) and copies them into DIR (default <repo>/gpu-bundle, git-ignored) with the shared
# libraries they need that a CUDA machine may lack (abseil, ...). tests/gpu/run_gpu_checks.sh
# then runs them on a GPU machine that has the CUDA runtime and cuBLAS but none of carpool's
# other build dependencies (the lent H200 image: no Debian packages, no network), so the
# end-to-end model tests and the model benchmark run there too, not only the kernel ones.
#
# Not bundled: glibc, libstdc++ and libgcc (the machine's own must be at least as new as this
# one's), and the CUDA libraries (cudart, cuBLAS/cuBLASLt, NCCL: the machine's CUDA must have the
# same major version as the nvcc that built the bundle; MANIFEST records it).
#
# With the device tool: make the bundle here, then run the checks there carrying it:
#   tests/gpu/make_gpu_bundle.sh
#   run(command="tests/gpu/run_gpu_checks.sh $OUT", carry=["gpu-bundle"])
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${1:-$ROOT/gpu-bundle}
BUILD=${2:-$ROOT/build}
TESTS=(carpool_cuda_kernels_test carpool_cuda_device_test carpool_cuda_model_test carpool_cuda_sampling_test)
BENCHES=(carpool-bench-cuda-kernels carpool-bench-gpu-model)

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  echo "no configured build in $BUILD: run 'make build' (or 'make test') first" >&2
  exit 2
fi
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
targets=()
for t in "${TESTS[@]}" "${BENCHES[@]}"; do targets+=(--target "$t"); done
if ! cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}"; then
  echo "could not build the GPU targets in $BUILD (configured without CUDA? is nvcc installed?)" >&2
  exit 2
fi

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
for t in "${TESTS[@]}"; do cp "$BUILD/tests/$t" "$DIR/bin/"; done
for b in "${BENCHES[@]}"; do cp "$BUILD/bin/$b" "$DIR/bin/"; done

# Every shared library the binaries load, except the C/C++ runtime and CUDA's own.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libcuda\.so)'
for f in "$DIR"/bin/*; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$DIR/lib/$name"
done

nvcc_version=$({ [ -n "$NVCC" ] && "$NVCC" --version; } | grep -o 'release [0-9.]*' || echo "release ?")
archs=$(grep '^CARPOOL_CUDA_ARCHITECTURES:' "$BUILD/CMakeCache.txt" | cut -d= -f2 || true)
{
  echo "carpool GPU bundle"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(
    git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
  echo "cuda: $nvcc_version; architectures: ${archs:-default}"
  echo "glibc: $(ldd --version | head -1)"
  echo "tests: ${TESTS[*]}"
  echo "benchmarks: ${BENCHES[*]}"
  echo "libraries: $(ls "$DIR/lib" | tr '\n' ' ')"
} >"$DIR/MANIFEST"
cat "$DIR/MANIFEST"
echo "size: $(du -sh "$DIR" | cut -f1)"
