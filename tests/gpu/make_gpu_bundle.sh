#!/usr/bin/env bash
# tests/gpu/make_gpu_bundle.sh [DIR [BUILD_DIR]]
#
# Builds here (where every build dependency is installed) everything tests/gpu/run_gpu_checks.sh
# runs on a GPU machine, and copies it into DIR (default <repo>/gpu-bundle, git-ignored): every
# gpu-labelled test binary (`ctest -N -L gpu` of BUILD_DIR, default <repo>/build), both GPU
# benchmarks, carpool, carpool-router and carpool-worker (the TP-2 step under mpirun), the shared
# libraries they load that a CUDA machine may lack (abseil, ZeroMQ, protobuf, OpenBLAS, Open
# MPI's libmpi, ...), the check scripts (tests/gpu/*.sh, cluster/launch/) and a MANIFEST. The
# binaries are stripped of debug sections and bin/ + lib/ packed as payload.tar.gz, so the bundle
# (about 40 MB) fits the device tool's 64 MiB carry beside the working tree.
# run_gpu_checks.sh then runs them on a GPU machine that has the CUDA runtime, cuBLAS and NCCL
# but none of carpool's other build dependencies (the lent H200 image: no Debian packages, no
# network), so the end-to-end model tests and the model benchmark run there, not only the
# kernel ones. The bundle is self-contained: DIR/tests/gpu/run_gpu_checks.sh OUT runs it from
# any folder.
#
# Not bundled: glibc, libstdc++ and libgcc (the machine's own must be at least as new as this
# one's), the CUDA libraries (cudart, cuBLAS/cuBLASLt, NCCL: 760 MB together; the machine's CUDA
# must have the same major version as the nvcc that built the bundle, MANIFEST records it;
# run_gpu_checks.sh also looks for NCCL in Python wheels), and mpirun: Open MPI's launcher with
# its plugins and help files is not relocatable from a bundle, so where the GPU machine has no
# mpirun the TP-2 step under mpirun is skipped with that reason (libmpi is bundled: the other
# binaries link it without starting MPI).
#
# With the device tool: make the bundle here, then run the checks there carrying it:
#   tests/gpu/make_gpu_bundle.sh
#   run(command="tests/gpu/run_gpu_checks.sh $OUT", carry=["gpu-bundle"])
# Environment: JOBS (build parallelism, default nproc).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${1:-$ROOT/gpu-bundle}
BUILD=${2:-$ROOT/build}
JOBS=${JOBS:-$(nproc)}
BENCHES=(carpool-bench-cuda-kernels carpool-bench-gpu-model)
TOOLS=(carpool carpool-router carpool-worker)

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  echo "no configured build in $BUILD: run 'make build' (or 'make test') first" >&2
  exit 2
fi
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
# The gpu-labelled test binaries, as CTest knows them.
mapfile -t TEST_PATHS < <(ctest --test-dir "$BUILD" -N -V -L gpu 2>/dev/null |
  awk '/Test command:/ {print $4}' | awk '!seen[$0]++')
if [ ${#TEST_PATHS[@]} -eq 0 ]; then
  echo "ctest lists no gpu-labelled tests in $BUILD (configured without CUDA?)" >&2
  exit 2
fi
TESTS=()
for t in "${TEST_PATHS[@]}"; do TESTS+=("$(basename "$t")"); done
targets=()
for t in "${TESTS[@]}" "${BENCHES[@]}" "${TOOLS[@]}"; do targets+=(--target "$t"); done
if ! cmake --build "$BUILD" -j "$JOBS" "${targets[@]}"; then
  echo "could not build the GPU targets in $BUILD (configured without CUDA? is nvcc installed?)" >&2
  exit 2
fi

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/tests/gpu" "$DIR/cluster"
for t in "${TEST_PATHS[@]}"; do cp "$t" "$DIR/bin/"; done
for b in "${BENCHES[@]}" "${TOOLS[@]}"; do cp "$BUILD/bin/$b" "$DIR/bin/"; done
cp "$ROOT"/tests/gpu/*.sh "$DIR/tests/gpu/"
cp -r "$ROOT/cluster/launch" "$DIR/cluster/"
strip --strip-debug "$DIR"/bin/*

# Every shared library the binaries load, except the C/C++ runtime and CUDA's own.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libcuda\.so)'
for f in "$DIR"/bin/*; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$DIR/lib/$name"
  strip --strip-debug "$DIR/lib/$name" 2>/dev/null || true
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
  echo "tools: ${TOOLS[*]}"
  echo "libraries: $(ls "$DIR/lib" | tr '\n' ' ')"
} >"$DIR/MANIFEST"
# bin/ and lib/ travel as one gzip'd tar (about 40 MB against 100 MB unpacked: the device tool
# carries 64 MiB with the working tree); run_gpu_checks.sh unpacks it on first use.
tar -C "$DIR" -cf - bin lib | gzip -6 >"$DIR/payload.tar.gz"
rm -rf "$DIR/bin" "$DIR/lib"
echo "payload: payload.tar.gz (bin/, lib/), $(du -b "$DIR/payload.tar.gz" | cut -f1) bytes" >>"$DIR/MANIFEST"
cat "$DIR/MANIFEST"
echo "size: $(du -sh "$DIR" | cut -f1)"
