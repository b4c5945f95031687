#!/bin/bash
# The peer vocabulary join: tests (2-4 ranks), compute-sanitizer over the peer tests, batch 1
# over 2 and 4 GPUs, peer against NCCL.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
export PARITY_MODELS_DIR=/tmp/parity-models
date
timeout 400 bash -c 'cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j64 --target run parity-synth parity-trace parity_tests 2>&1 | grep -E "error|FAILED" -A5 | head -30; cmake --build build-device -j64 --target run parity-synth parity-trace parity_tests 2>&1 | tail -1'
date
echo "== tests"
timeout 400 build-device/bin/parity_tests --gtest_filter='PeerGroup.*:NcclGroup.*:EngineTensorParallel.*:TraceGroup.*:DeviceKernels.RankSum*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|Failure|error" | grep -v blamed | head -30
echo "== compute-sanitizer memcheck, the peer tests"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build-device/bin/parity_tests --gtest_filter='PeerGroup.Every*:EngineTensorParallel.ThePeer*' 2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid" | head; echo "compute-sanitizer exit ${PIPESTATUS[0]}"
date
synth() { [ -f /tmp/parity-models/$1/config.json ] && return
  /usr/bin/time -f "synth $1: %e s" timeout 400 build-device/bin/parity-synth --preset $1 --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/$1 > /dev/null; }
mkdir -p /tmp/req; make_requests 1 20 400 /tmp/req/m-1.txt; make_requests 64 20 400 /tmp/req/m-64.txt
bench() {  # bench MODEL TP ALLREDUCE N
  local tpa=(); [ "$2" -gt 1 ] && tpa=(--tensor-parallel $2 --all-reduce $3)
  local gen=128; [ $4 = 1 ] && gen=256
  echo "== $1 bf16 TP$2 $3 $4 requests"
  timeout 240 build-device/bin/run /tmp/parity-models/$1 --backend hip --precision bf16 "${tpa[@]}" -m getp --no-progress -i /tmp/req/m-$4.txt -o /tmp/req/o-$1-$2-$3-$4.txt -n $gen --max-batch $4 --step-tokens 2048 --context 4096 --kv-memory 16G 2>&1 | grep -E "TPOT|error" | head -3
}
gpus=$(nvidia-smi -L | wc -l)
synth 20b
for tp in 2 4; do [ $tp -le $gpus ] || continue; for ar in peer nccl; do bench 20b $tp $ar 1; done; done
bench 20b $gpus peer 64; bench 20b $gpus nccl 64
cmp /tmp/req/o-20b-$gpus-peer-64.txt /tmp/req/o-20b-$gpus-nccl-64.txt && echo "20b TP$gpus 64 requests: peer and nccl tokens identical"
date
synth 120b
for tp in 2 4; do [ $tp -le $gpus ] || continue; for ar in peer nccl; do bench 120b $tp $ar 1; done; done
date
