#!/usr/bin/env bash
# The main job on the built-in tiny synthetic model: set up, build, then trace the float64
# reference against the cpu-f32 candidate past the sliding window and name any divergence.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/bin/parity-trace --model tiny --tokens 1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900 \
  --out out/tiny "$@"
