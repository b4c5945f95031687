#!/bin/bash
# The bf16 attention kernel: build, its tests, the device tests, bf16 traces.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build build-device -j16 --target run parity-synth parity-trace parity_tests parity-bench 2>&1 | grep -E "error|FAILED" -A5 | head -30
el built
B=build-device/bin
timeout 200 $B/parity_tests --gtest_filter='DeviceKernels.Attention*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|Failure|error|Expected|Which is|share|elements" | head -60
el attention tests
M=/tmp/parity-models; mkdir -p $M
tok="1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900"
timeout 120 $B/parity-trace --model tiny --models-dir $M --tokens "$tok" --generate 8 --candidate hip --precision bf16 --out /tmp/t-tiny 2>&1 | grep -E "^(PASS|DIVERGED)|error" | cut -c1-300
timeout 120 $B/parity-trace --model tiny --models-dir $M --token 5 --pos 4000 --candidate hip --precision bf16 --out /tmp/t-tiny4k 2>&1 | grep -E "^(PASS|DIVERGED)|error" | cut -c1-300
el tiny
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
for pos in 0 1000 2049; do
  timeout 150 $B/parity-trace --model $M/20b --token 0 --pos $pos --candidate hip --precision bf16 --step 256 --out /tmp/t20-$pos > /tmp/t20-$pos.log 2>&1
  echo "20b pos $pos exit $?"; grep -E "^(PASS|DIVERGED)" /tmp/t20-$pos/report.txt | cut -c1-300
  python3 - /tmp/t20-$pos/report.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); worst = {}
for d in j["datasets"]:
    s = (d.get("local") or {}).get("share")
    if s is not None: worst[d["stage"]] = max(worst.get(d["stage"], 0), s)
print("  local share max: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(worst.items())))
PY
  el 20b $pos
done
timeout $(( 590 - ($(date +%s) - T0) )) $B/parity_tests --gtest_filter='DeviceKernels.*:EngineDevice*:DeviceRuntime*:*CandidateTest*hip*:*InjectionTest*hip_*:*Mutation*hip*:EngineTensor*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error" | head -40
el end
