#!/bin/bash
# Group traces on two GPUs: build, tests, 20b traced split.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total --format=csv
date
timeout 420 bash -c 'cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j32 --target run parity-synth parity-trace parity_tests 2>&1 | tail -1'
date
export PARITY_MODELS_DIR=/tmp/parity-models
timeout 300 build-device/bin/parity_tests --gtest_filter="${TESTS:-TraceGroup*}" 2>&1 | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED|blamed) |tests ran|Failure|Expected|Which is|actual|DIVERGED|PASS:" | cut -c1-400
date
[ -d /tmp/parity-models/20b ] || timeout 60 build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/20b > /dev/null
for prec in ${PRECS:-fp32 bf16}; do
  for pos in 0 200; do
    echo "== 20b $prec TP2 pos $pos (reference runs the prefix, replay)"
    timeout 200 build-device/bin/parity-trace --model 20b --candidate hip --precision $prec --tensor-parallel 2 --token 5 --pos $pos --out /tmp/t20-$prec-$pos 2>&1 | grep -E "PASS|DIVERGED|timing|error" | cut -c1-400
  done
  for pos in 200 1000 4000; do
    echo "== 20b $prec TP2 pos $pos (skip reference prefix)"
    timeout 200 build-device/bin/parity-trace --model 20b --candidate hip --precision $prec --tensor-parallel 2 --token 5 --pos $pos --skip-reference-prefix --out /tmp/t20s-$prec-$pos 2>&1 | grep -E "PASS|DIVERGED|timing|error" | cut -c1-400
  done
  date
done
