#!/usr/bin/env bash
# Installs the Debian packages gpt-oss-parity needs (when missing) and builds it into build/.
# Usage: scripts/setup.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."

# nodejs and npm run the tokenizer's oracle (scripts/tokenizer_oracle.sh). npm is listed only where
# no npm command exists: NodeSource's nodejs bundles npm and conflicts with Debian's npm package.
packages=(cmake ninja-build g++ pkg-config libhdf5-dev libcli11-dev libfmt-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libpugixml-dev libxxhash-dev libpcre2-dev nodejs
          $(command -v npm >/dev/null || echo npm))
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU="${GPU:-auto}" "$@"
cmake --build build -j"$(nproc)"
