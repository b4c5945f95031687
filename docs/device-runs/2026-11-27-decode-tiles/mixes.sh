#!/usr/bin/env bash
# The bf16 targets on the committed code: batch 1 (parity-bench) and the serving mixes.
set -uo pipefail
export LOG_DIR=$OUT/logs
mkdir -p $LOG_DIR
T0=$SECONDS
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
(cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j16 --target run parity-synth parity-bench > $OUT/build.log 2>&1) || { tail -30 $OUT/build.log; exit 1; }
echo "build done at $((SECONDS - T0)) s"
PRECISION=bf16 scripts/device_check.sh bench
echo "bench done at $((SECONDS - T0)) s"
PRECISION=bf16 scripts/device_check.sh serving-bench
echo "serving done at $((SECONDS - T0)) s"
