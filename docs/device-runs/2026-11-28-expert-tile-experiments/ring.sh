#!/bin/bash
# The expert tiles' weights through a ring of asynchronous copies in shared memory, against the
# tree before (exp/base); one H200, synthetic 20b.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
(cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j11 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P1=$!
(cd exp/base && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j5 --target run parity-bench 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P2=$!
wait $P1 $P2
el built
B=build-device/bin
timeout 120 $B/parity_tests --gtest_filter='DeviceKernels.Moe*:MoeTilingChoice.*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|bits|Expected" | head -20
timeout 60 compute-sanitizer --error-exitcode 9 --print-limit 20 --tool memcheck $B/parity_tests --gtest_filter='DeviceKernels.MoeTilingsAgreeInBf16SmallShapes:DeviceKernels.MoeMmaPathsAgainstTheReference' --gtest_brief=1 2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | head
timeout 60 compute-sanitizer --error-exitcode 9 --print-limit 20 --tool racecheck $B/parity_tests --gtest_filter='DeviceKernels.MoeTilingsAgreeInBf16SmallShapes:DeviceKernels.MoeMmaPathsAgainstTheReference' --gtest_brief=1 2>&1 | grep -E "RACECHECK SUMMARY|PASSED|FAILED" | head
el tests
M=/tmp/parity-models; mkdir -p $M /tmp/req
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
make_requests 64 20 400 /tmp/req/m64.txt; make_requests 256 20 400 /tmp/req/m256.txt; head -1 /tmp/req/m64.txt > /tmp/req/m1.txt
el ready
for tree in base new; do
  B=build-device/bin; [ $tree = base ] && B=exp/base/build-device/bin
  for p in bf16 fp32; do
    echo "== $tree $p batch 1, positions 0..127"
    timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision $p --positions 128 --warmup 16 -q 2>&1 | grep -E "median" | head -1
    run=($B/run $M/20b --backend hip --precision $p -m getp --no-progress)
    echo "== $tree $p 64 requests"
    timeout 60 "${run[@]}" -i /tmp/req/m64.txt -o /tmp/req/$tree-$p-64.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -1
  done
  echo "== $tree bf16 256 requests"
  timeout 60 $B/run $M/20b --backend hip --precision bf16 -m getp --no-progress -i /tmp/req/m256.txt -o /tmp/req/$tree-256.txt -n 128 --max-batch 256 --step-tokens 4096 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -1
  echo "== $tree kernel times, bf16 64 requests"
  timeout 60 $B/run $M/20b --backend hip --precision bf16 -m getp --no-progress -i /tmp/req/m64.txt -o /tmp/req/kt.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 --kernel-times 2>&1 | grep -E "^(mlp1|mlp2|scores|qkv|o_proj|lm_head|router) " | head -8
  echo "== $tree kernel times, bf16 batch 1"
  timeout 60 $B/run $M/20b --backend hip --precision bf16 -m getp --no-progress -i /tmp/req/m1.txt -o /tmp/req/kt1.txt -n 64 --max-batch 1 --context 4096 --kernel-times 2>&1 | grep -E "^(mlp1|mlp2|scores|qkv|o_proj|lm_head|router) " | head -8
  el $tree
done
for n in bf16-64 fp32-64 256; do echo "requests whose tokens differ base/new ($n): $(diff <(cut -f1 /tmp/req/base-$n.txt) <(cut -f1 /tmp/req/new-$n.txt) | grep -c '^<' || true)"; done
B=build-device/bin
tok="1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900"
for p in bf16 fp32; do
  timeout 60 $B/parity-trace --model tiny --models-dir $M --tokens "$tok" --generate 8 --candidate hip --precision $p --out /tmp/t-tiny-$p 2>&1 | grep -E "^(PASS|DIVERGED)|error:" | cut -c1-250
done
el traces
timeout $(( 585 - ($(date +%s) - T0) )) $B/parity_tests --gtest_filter='DeviceKernels.*:EngineDevice*:DeviceRuntime*:TraceGroup*:*CandidateTest*hip*:*InjectionTest*hip_*:*Mutation*hip*:EngineTensor*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|SKIPPED" | head -30
el end
