#!/bin/bash
# The BF16 KV cache (bf16 precision): build, kernel tests, bf16 traces, the sanitizers over the
# attention and RoPE kernels, the device filter.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build build-device -j16 2>&1 | grep -E "error:|FAILED" -A5 | head -30
el built
B=build-device/bin
timeout 150 $B/parity_tests --gtest_filter='DeviceKernels.Attention*:DeviceKernels.Rope*:KvLayout.*:ServingLimits.*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|Expected|Which|describe|attention heads" | head -40
el kernel tests
M=/tmp/parity-models; mkdir -p $M
tok="1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900"
timeout 60 $B/parity-trace --model tiny --models-dir $M --tokens "$tok" --generate 8 --candidate hip --precision bf16 --out /tmp/t-tiny 2>&1 | grep -E "^(PASS|DIVERGED)|error:" | cut -c1-300
htok="$(awk 'BEGIN { for (i = 0; i < 200; i++) printf "%s%d", (i ? "," : ""), (7 + 7919 * i) % 512 }')"
for m in hf-tiny hf-large; do
  timeout 60 $B/parity-trace --model golden/$m --tokens "$htok" --candidate hip --precision bf16 --out /tmp/t-$m 2>&1 | grep -E "^(PASS|DIVERGED)|error:" | cut -c1-300
done
el tiny hf
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
for pos in 200 1000 4000; do
  extra=(); [ $pos = 4000 ] && extra=(--skip-reference-prefix)
  timeout 100 $B/parity-trace --model $M/20b --token 0 --pos $pos --candidate hip --precision bf16 --step 256 "${extra[@]}" --out /tmp/t20-$pos > /tmp/t20-$pos.log 2>&1
  echo "20b pos $pos exit $?"; grep -E "^(PASS|DIVERGED)" /tmp/t20-$pos/report.txt | cut -c1-300
  el 20b $pos
done
timeout 100 compute-sanitizer --error-exitcode 9 --print-limit 20 --tool memcheck $B/parity_tests --gtest_filter='DeviceKernels.AttentionMma*:DeviceKernels.AttentionFloatKernelsOverABf16Cache:DeviceKernels.Rope*' --gtest_brief=1 2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid" | head
timeout 100 compute-sanitizer --error-exitcode 9 --print-limit 20 --tool racecheck $B/parity_tests --gtest_filter='DeviceKernels.AttentionMma*:DeviceKernels.AttentionFloatKernelsOverABf16Cache:DeviceKernels.Rope*' --gtest_brief=1 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" | head
el sanitize
timeout $(( 585 - ($(date +%s) - T0) )) $B/parity_tests --gtest_filter='DeviceKernels.*:EngineDevice*:DeviceRuntime*:TraceGroup*:*CandidateTest*hip*:*InjectionTest*hip_*:*Mutation*hip*:EngineTensor*:Lockstep*:FusedStages*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|SKIPPED" | head -40
el end
