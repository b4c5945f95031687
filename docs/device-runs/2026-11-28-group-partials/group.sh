#!/bin/bash
# Two GPUs: the tree with the BF16 KV cache and the group backend's kept partial sums -- the
# tensor-parallel and group-trace tests (they need two GPUs), the hip candidates' tests.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build build-device -j30 2>&1 | grep -E "error:|FAILED" -A5 | head -30
el built
B=build-device/bin
timeout 200 $B/parity_tests --gtest_filter='TraceGroup*:EngineTensor*' 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED) |FAILED|Failure|tests ran|PASSED|error:" | head -40
el group tests
timeout 200 $B/parity_tests --gtest_filter='*CandidateTest*hip*:DeviceRuntime*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|SKIPPED" | head -20
el end
