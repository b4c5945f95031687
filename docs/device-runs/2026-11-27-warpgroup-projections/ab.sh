#!/usr/bin/env bash
# The dense projections on the warpgroup tiles: tests, and the tree before against this one.
set -uo pipefail
export LOG_DIR=$OUT/logs
mkdir -p $LOG_DIR
scripts/device_check.sh build || exit 1
export LD_LIBRARY_PATH=$PWD/build-devdeps/lib CMAKE_PREFIX_PATH=$PWD/build-devdeps PKG_CONFIG_PATH=$PWD/build-devdeps/lib/pkgconfig
B=build-device/bin
[ -n "${SKIP_TESTS:-}" ] || $B/parity_tests --gtest_filter='DeviceKernels.Gemv*:DeviceKernels.MoeTilings*:DeviceKernels.Warpgroup*:DeviceKernels.*Bf16*' --gtest_brief=1 2>&1 | tail -5 | tee $OUT/kernel-tests.txt
rm -rf ab-old && mkdir ab-old && git archive ${OLD:-HEAD} | tar -x -C ab-old && ln -s ../build-devdeps ab-old/build-devdeps
(cd ab-old && cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j16 --target run parity-bench > $OUT/old-build.log 2>&1) || { tail $OUT/old-build.log; exit 1; }
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
M=/tmp/parity-models/20b
$B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M > /dev/null
R=/tmp/req; mkdir -p $R
for n in 64 128 256 512; do make_requests $n 5 10 $R/short-$n.txt; done
make_requests 16 1600 1700 $R/long-16.txt
for round in 1 2; do
for tree in old new; do
  bin=$B; [ $tree = old ] && bin=ab-old/build-device/bin
  run=($bin/run $M --backend hip --precision bf16 -m getp --no-progress)
  for n in 64 128 256 512; do
    echo "=== $tree round $round decode $n"
    "${run[@]}" -i $R/short-$n.txt -o $OUT/$tree-$n.txt -n 128 --max-batch $n --step-tokens 4096 2>&1 | grep '^run: [0-9]'
  done
  echo "=== $tree round $round prefill 16x1650"
  "${run[@]}" -i $R/long-16.txt -o $OUT/$tree-long.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 2>&1 | grep '^run: [0-9]'
done
done > $OUT/ab.txt 2>&1
for n in 64 128 256 512 long; do cmp $OUT/old-$n.txt $OUT/new-$n.txt && echo "same tokens $n"; done >> $OUT/ab.txt
run=($B/run $M --backend hip --precision bf16 -m getp --no-progress)
for n in 64 256 512; do
  echo "=== new decode $n kernel times"; "${run[@]}" -i $R/short-$n.txt -o /tmp/o.txt -n 128 --max-batch $n --step-tokens 4096 --kernel-times 2>&1 | sed -n '/kernels of/,$p' | head -9
done > $OUT/kernel-times.txt 2>&1
echo "=== new prefill kernel times" >> $OUT/kernel-times.txt
"${run[@]}" -i $R/long-16.txt -o /tmp/o.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 --kernel-times 2>&1 | sed -n '/kernels of/,$p' | head -9 >> $OUT/kernel-times.txt
timeout 240 ncu --kernel-name regex:'moe_wgmma' --launch-skip 96 --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  "${run[@]}" -i $R/short-512.txt -o /tmp/o.txt -n 4 --max-batch 512 --step-tokens 4096 > $OUT/ncu-moe-wgmma.txt 2>&1
cat $OUT/ab.txt; cat $OUT/kernel-times.txt
