#!/usr/bin/env bash
# Device verification of the grouped MoE kernel: new tree (/tmp/src) and the tree before it
# (/tmp/old), built side by side; steps: build tests traces bench hf
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
step_build() {
  (cd /tmp/src && bash scripts/device_check.sh build >/dev/null && echo "new built")
  (cd /tmp/old && BUILD_DIR=build-device LOG_DIR=$OUT/old bash scripts/device_check.sh build >/dev/null && echo "old built")
}
step_tests() {
  cd /tmp/src
  build-device/bin/parity_tests --gtest_filter='DeviceKernels.*' --gtest_brief=1 2>&1 | tail -4
  OMP_NUM_THREADS=2 ctest --test-dir build-device -j16 --timeout 300 2>&1 | grep -E "tests passed|\(Failed\)"
  bash scripts/device_check.sh engine 2>&1 | tail -3
}
step_traces() {
  cd /tmp/src
  bash scripts/device_check.sh tiny 2>&1 | grep -E "^(PASS|DIVERGED)"
  [ -f $M/20b/config.json ] || build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b >/dev/null
  for pos in 0 200; do
    build-device/bin/parity-trace --model $M/20b --token 0 --pos $pos --candidate hip --step 256 --out /tmp/t$pos >/dev/null 2>&1
    echo "20b pos $pos exit $?: $(grep -E '^(PASS|DIVERGED)' /tmp/t$pos/report.txt | cut -c1-200)"
    rm -rf /tmp/t$pos
  done
}
bench_one() {  # bench_one TREE LABEL ARGS...
  local tree=$1 label=$2; shift 2
  echo "$label: $(/tmp/$tree/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/o-$tree.txt "$@" 2>&1 | grep '^run: [0-9]')"
}
step_bench() {
  cd /tmp/src
  [ -f $M/20b/config.json ] || build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b >/dev/null
  source <(sed -n '/^make_requests() {/,/^}/p' scripts/device_check.sh)
  make_requests 64 20 400 /tmp/mixed-64.txt; make_requests 8 20 400 /tmp/mixed-8.txt; make_requests 16 1600 1700 /tmp/long-16.txt
  for tree in old src; do
    bench_one $tree "$tree N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048; cp /tmp/o-$tree.txt /tmp/o64-$tree.txt
    bench_one $tree "$tree N=8" -i /tmp/mixed-8.txt -n 128 --max-batch 8 --step-tokens 2048
    bench_one $tree "$tree prefill" -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096
  done
  cmp /tmp/o64-old.txt /tmp/o64-src.txt && echo "N=64 outputs identical old/new"
  /tmp/src/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/k.txt -i /tmp/mixed-64.txt -n 16 --max-batch 64 --step-tokens 2048 --kernel-times 2>&1 | sed -n '/kernel times/,/^all/p'
}
step_hf() {
  cd /tmp/src
  export PYTHONPATH=/tmp/src/python
  tiny_tokens="$(seq -s, 3 7 200)"
  python3 -m parity_capture.hf golden/hf-tiny --tokens "$tiny_tokens" --dtype float64 --device cuda --out /tmp/hf64.h5 2>&1 | grep -v "Loading weights" | tail -2
  build-device/bin/parity-trace --model golden/hf-tiny --candidate-trace /tmp/hf64.h5 --out /tmp/hf64 >/dev/null 2>&1; echo "parity-trace exit $?"
  grep -E "^(PASS|DIVERGED)" /tmp/hf64/report.txt | head -2
  python3 build-devdeps/stage_summary.py /tmp/hf64/report.json
  cp /tmp/hf64/report.txt $OUT/hf-tiny-float64-report.txt
}
setup
for s in "$@"; do echo "== $s"; "step_$s"; done
