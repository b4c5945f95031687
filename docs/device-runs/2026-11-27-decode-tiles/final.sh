#!/usr/bin/env bash
# The narrow projection tiles and the bf16 16-pair expert tiles: tests, sanitizer, verdict, figures.
set -uo pipefail
export LOG_DIR=$OUT/logs
mkdir -p $LOG_DIR
T0=$SECONDS
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
(cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j16 --target run parity-synth parity-trace parity_tests > $OUT/build.log 2>&1) || { tail -30 $OUT/build.log; exit 1; }
echo "build done at $((SECONDS - T0)) s"
B=build-device/bin
timeout 150 $B/parity_tests --gtest_filter='DeviceKernels.*' --gtest_brief=1 > $OUT/tests.txt 2>&1; echo "suite exit $? at $((SECONDS - T0)) s: $(tail -3 $OUT/tests.txt | tr '\n' ' ')"
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
M=/tmp/parity-models/20b
$B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M > /dev/null
R=/tmp/req; mkdir -p $R
for n in 32 64 128 256 512; do make_requests $n 5 10 $R/short-$n.txt; done
make_requests 16 1600 1700 $R/long-16.txt
run=($B/run $M --backend hip --precision bf16 -m getp --no-progress)
for n in 32 64 128 256 512; do
  echo "=== decode $n"; timeout 60 "${run[@]}" -i $R/short-$n.txt -o $OUT/new-$n.txt -n 128 --max-batch $n --step-tokens 4096 2>&1 | grep '^run: [0-9]'
done > $OUT/bench.txt 2>&1
echo "=== prefill 16x1650" >> $OUT/bench.txt
timeout 60 "${run[@]}" -i $R/long-16.txt -o $OUT/new-long.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 2>&1 | grep '^run: [0-9]' >> $OUT/bench.txt
echo "=== decode 64 kernel times" >> $OUT/bench.txt
timeout 60 "${run[@]}" -i $R/short-64.txt -o /tmp/o.txt -n 128 --max-batch 64 --step-tokens 4096 --kernel-times 2>&1 | sed -n '/kernels of/,$p' | head -12 >> $OUT/bench.txt
echo "bench done at $((SECONDS - T0)) s"
PRECISION=bf16 timeout 120 scripts/device_check.sh tiny > $OUT/tiny.txt 2>&1; echo "tiny exit $? at $((SECONDS - T0)) s"; grep -iE "verdict|PASS|FAIL" $OUT/tiny.txt | head -5
timeout -s KILL 70 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 $B/parity_tests --gtest_filter='DeviceKernels.GemvWideAndQuarterTilesAgree' --gtest_brief=1 > $OUT/sanitize-memcheck.txt 2>&1
echo "memcheck exit $? at $((SECONDS - T0)) s: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $OUT/sanitize-memcheck.txt | tr '\n' ' ')"
cat $OUT/bench.txt
