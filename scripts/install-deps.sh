#!/usr/bin/env bash
# Installs every Debian package carpool needs to build, test and run.
# Idempotent: asks dpkg first and calls apt-get only for what is missing.
# This file is the one place that names the project's Debian packages.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git
  clang libclang-rt-dev
  libabsl-dev
  libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev
  libzmq3-dev cppzmq-dev
  libprotobuf-dev protobuf-compiler
  libopenmpi-dev openmpi-bin
  slurmctld slurmd slurm-client munge
  libcpp-httplib-dev libboost-dev
  libpcre2-dev libicu-dev
  libsqlite3-dev
  iproute2
  python3 python3-zmq python3-protobuf python3-numpy python3-pytest python3-matplotlib python3-requests python3-prometheus-client python3-jinja2
)

# The tokenizer tests check carpool against the Hugging Face library from npm: Debian's nodejs
# and npm, unless this machine already has an npm of its own (another nodejs build).
if ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
