#!/bin/bash
# The fused router's decision by warp arg-max (topk_softmax_row) instead of a rank per expert:
# its tests, the batch-1 kernel times and parity-bench on the 20b, then the device filter.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build build-device -j16 2>&1 | grep -E "error:|FAILED" -A5 | head -30
el built
B=build-device/bin
timeout 60 $B/parity_tests --gtest_filter='DeviceKernels.Router*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:" | head -20
M=/tmp/parity-models; mkdir -p $M /tmp/req; make_requests 1 20 400 /tmp/req/m1.txt
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
timeout 60 "${run[@]}" -i /tmp/req/m1.txt -o /tmp/req/kt1.txt -n 256 --max-batch 1 --kernel-times 2>&1 | grep -E "^(router|mlp1|qkv)\b" | head -4
timeout 60 "${run[@]}" -i /tmp/req/m1.txt -o /tmp/req/r1.txt -n 256 --max-batch 1 2>&1 | grep -E "^run: [0-9]" | head -2
el bench
timeout $(( 330 - ($(date +%s) - T0) )) $B/parity_tests --gtest_filter='DeviceKernels.*:EngineDevice*:DeviceRuntime*:*CandidateTest*hip*:*InjectionTest*hip_*:*Mutation*hip*:Lockstep*:FusedStages*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|SKIPPED" | head -40
el end
