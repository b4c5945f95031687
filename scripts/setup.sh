#!/usr/bin/env bash
# Installs the Debian packages gpt-oss-parity needs (when missing) and builds it into build/.
# Usage: scripts/setup.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."

# python3-h5py, python3-numpy and python3-xxhash run the Python capture's test
# (python/parity_capture; xxhash computes the checkpoint fingerprint), python3-pip and
# python3-setuptools install it as a package in that test, python3-hypothesis draws the hostile
# arguments of its other test;
# libopenmpi-dev and openmpi-bin build `run` with MPI and run its two-rank test.
# nodejs and npm run the tokenizer's oracle (scripts/tokenizer_oracle.sh). npm is listed only where
# no npm command exists: NodeSource's nodejs bundles npm and conflicts with Debian's npm package.
packages=(cmake ninja-build g++ pkg-config libhdf5-dev libcli11-dev libfmt-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libpugixml-dev libxxhash-dev libpcre2-dev nodejs
          python3-h5py python3-numpy python3-xxhash python3-pip python3-setuptools python3-hypothesis
          libopenmpi-dev openmpi-bin
          $(command -v npm >/dev/null || echo npm))
bash scripts/install_packages.sh "${packages[@]}"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU="${GPU:-auto}" "$@"
cmake --build build -j"$(nproc)"
