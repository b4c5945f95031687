#!/usr/bin/env bash
# Device verification and benchmarks: the new tree (/tmp/src) and the tree before it (/tmp/old),
# built side by side; steps: build tests sanitize traces bench quick moetests ncu sass depth ctest
set -uo pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
M=/tmp/parity-models
export LOG_DIR=$OUT GPU=cuda
setup() {
  for t in src old; do
    [ -d /tmp/$t ] && continue
    mkdir -p /tmp/$t && tar -xzf $R/build-devdeps/$t.tar.gz -C /tmp/$t && cp -r $R/build-devdeps /tmp/$t/
  done
}
synth20b() {
  [ -f $M/20b/config.json ] || /tmp/src/build-device/bin/parity-synth --preset 20b --tokenizer /tmp/src/build-devdeps/o200k_harmony/tokenizer.json --out $M/20b >/dev/null
}
step_build() {
  (cd /tmp/src && bash scripts/device_check.sh build >/dev/null && echo "new built")
  [ "${NO_OLD:-0}" = 1 ] || (cd /tmp/old && LOG_DIR=$OUT/old bash scripts/device_check.sh build >/dev/null && echo "old built")
}
step_tests() {
  cd /tmp/src
  build-device/bin/parity_tests --gtest_filter='DeviceKernels.*' --gtest_brief=1 2>&1 | tail -30
  bash scripts/device_check.sh engine 2>&1 | tail -4
}
step_ctest() {
  cd /tmp/src
  OMP_NUM_THREADS=2 ctest --test-dir build-device -j8 --timeout 300 2>&1 | grep -E "tests passed|\(Failed\)|Timeout"
}
step_sanitize() {
  cd /tmp/src
  timeout -s KILL 300 compute-sanitizer --error-exitcode 9 --print-limit 10 --tool memcheck build-device/bin/parity_tests --gtest_filter='DeviceKernels.Moe*:DeviceKernels.Gemv*' --gtest_brief=1 2>&1 | tail -3
  timeout -s KILL 300 compute-sanitizer --error-exitcode 9 --print-limit 10 --tool initcheck build-device/bin/parity_tests --gtest_filter='DeviceKernels.MoeTilingsAgreeOdd*:DeviceKernels.MoeMma*' --gtest_brief=1 2>&1 | tail -3
}
step_traces() {
  cd /tmp/src
  bash scripts/device_check.sh tiny 2>&1 | grep -E "^(PASS|DIVERGED)"
  synth20b
  for pos in 0 200 1000; do
    build-device/bin/parity-trace --model $M/20b --token 0 --pos $pos --candidate hip --step 256 --out /tmp/t$pos >/dev/null 2>&1
    echo "20b pos $pos exit $?: $(grep -E '^(PASS|DIVERGED)' /tmp/t$pos/report.txt | cut -c1-200)"
    [ $pos = 200 ] && cp /tmp/t$pos/report.txt $OUT/20b-pos200-report.txt
    rm -rf /tmp/t$pos
  done
}
bench_one() {  # bench_one TREE LABEL ARGS...
  local tree=$1 label=$2; shift 2
  echo "$label: $(/tmp/$tree/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/o-$tree.txt "$@" 2>&1 | grep '^run: [0-9]')"
}
step_bench() {
  cd /tmp/src
  synth20b
  source <(sed -n '/^make_requests() {/,/^}/p' scripts/device_check.sh)
  make_requests 64 20 400 /tmp/mixed-64.txt; make_requests 8 20 400 /tmp/mixed-8.txt; make_requests 16 1600 1700 /tmp/long-16.txt
  make_requests 1 60 60 /tmp/one.txt
  for tree in old src; do
    echo "$tree parity-bench b1: $(/tmp/$tree/build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"
    bench_one $tree "$tree N=1" -i /tmp/one.txt -n 128 --max-batch 1
    bench_one $tree "$tree N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048; cp /tmp/o-$tree.txt /tmp/o64-$tree.txt
    bench_one $tree "$tree N=8" -i /tmp/mixed-8.txt -n 128 --max-batch 8 --step-tokens 2048
    bench_one $tree "$tree prefill" -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096
  done
  cmp /tmp/o64-old.txt /tmp/o64-src.txt && echo "N=64 outputs identical old/new" || echo "N=64 outputs differ old/new (expected: other rounding order)"
  /tmp/src/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/k.txt -i /tmp/mixed-64.txt -n 16 --max-batch 64 --step-tokens 2048 --kernel-times 2>&1 | sed -n '/kernel times/,/^all/p'
}
step_quick() {  # the new tree alone: batch 1 and the batched figures, kernel times at batch 1
  cd /tmp/src
  synth20b
  source <(sed -n '/^make_requests() {/,/^}/p' scripts/device_check.sh)
  make_requests 64 20 400 /tmp/mixed-64.txt; make_requests 16 1600 1700 /tmp/long-16.txt; make_requests 1 60 60 /tmp/one.txt
  echo "src parity-bench b1: $(build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"
  bench_one src "src N=1" -i /tmp/one.txt -n 128 --max-batch 1
  bench_one src "src N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048
  bench_one src "src prefill" -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096
  build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/k1.txt -i /tmp/one.txt -n 64 --max-batch 1 --kernel-times 2>&1 | sed -n '/kernel times/,/^all/p'
}
step_moetests() {
  cd /tmp/src
  build-device/bin/parity_tests --gtest_filter='DeviceKernels.Moe*' --gtest_brief=1 2>&1 | tail -5
}
step_ncu() {  # batch-1 profile of the expert and dense kernels (clocks as found)
  cd /tmp/src
  synth20b
  command -v ncu >/dev/null || { echo "no ncu"; return 0; }
  timeout 240 ncu --clock-control none --kernel-name regex:"moe_mma|gemv_bias_w|split" --launch-skip 40 --launch-count 8 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section InstructionStats --section SchedulerStats \
    build-device/bin/parity-bench --model $M/20b --backend hip --positions 2 --warmup 1 -q > $OUT/ncu.txt 2>&1
  grep -E "moe_mma|gemv_bias|split_inputs|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Compute \(SM\)" $OUT/ncu.txt | head -80
}
step_sass() {  # instruction mix of the expert kernels
  cd /tmp/src
  local o=build-device/device/CMakeFiles/parity_device.dir/experts.hip.o
  cuobjdump -sass $o > $OUT/experts.sass 2>&1; echo sass dumped
}
# The depth step rebuilt the intermediate trees that still had the PARITY_DENSE_MMA_DEPTH knob; the
# final tree fixes the depth (kDepth in device/linear.hip), so the step no longer changes anything.
step_depth() {  # batch 1 with other depths of the dense MMA kernel's weight ring
  cd /tmp/src
  for D in ${DEPTHS:-2 6}; do
    sed -i "s/^#define PARITY_DENSE_MMA_DEPTH .*/#define PARITY_DENSE_MMA_DEPTH $D/" device/linear.hip
    cmake --build build-device -j16 >/dev/null 2>&1 || { echo "depth $D: build failed"; continue; }
    for i in 1 2; do echo "depth $D parity-bench b1: $(build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"; done
  done
  git -C /tmp/src checkout device/linear.hip 2>/dev/null || tar -xzf $R/build-devdeps/src.tar.gz -C /tmp/src device/linear.hip
  cmake --build build-device -j16 >/dev/null 2>&1 && echo "default depth rebuilt"
}
setup
for s in "$@"; do echo "== $s"; "step_$s"; done
