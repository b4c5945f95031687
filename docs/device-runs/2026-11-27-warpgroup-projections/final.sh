#!/usr/bin/env bash
set -uo pipefail
export LOG_DIR=$OUT/logs
mkdir -p $LOG_DIR
scripts/device_check.sh build tests || exit 1
export LD_LIBRARY_PATH=$PWD/build-devdeps/lib
cs=(timeout -s KILL 300 compute-sanitizer --error-exitcode 9 --print-limit 20)
for tool in memcheck racecheck synccheck; do
  "${cs[@]}" --tool $tool build-device/bin/parity_tests --gtest_filter='DeviceKernels.GemvWideAndQuarterTilesAgree:DeviceKernels.MoeTilingsAgreeInBf16SmallShapes' --gtest_brief=1 > $OUT/sanitize-$tool.txt 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' $OUT/sanitize-$tool.txt | tr '\n' ' ')"
done
PRECISION=bf16 scripts/device_check.sh tiny 20b
