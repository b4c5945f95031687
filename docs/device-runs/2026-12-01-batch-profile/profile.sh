#!/bin/bash
# Every kernel of batch-1 and 64-request runs under Nsight Compute (scripts/device_check.sh
# profile), main's bf16 figures on the same machine, and the expert kernels' machine code.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j16 --target run parity-bench parity-synth 2>&1 | grep -E "error:|FAILED:" -A5 | head -30
el built
M=/tmp/parity-models; B=build-device/bin
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
el ready
mkdir -p /tmp/req; make_requests 64 20 400 /tmp/req/m64.txt; head -n 1 /tmp/req/m64.txt > /tmp/req/m1.txt
timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision bf16 --positions 128 --warmup 16 -q 2>&1 | grep -E "median|bandwidth"
run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
timeout 60 "${run[@]}" -i /tmp/req/m1.txt -o /tmp/req/o1.txt -n 256 --max-batch 1 2>&1 | grep -E "^run: [0-9]"
timeout 90 "${run[@]}" -i /tmp/req/m64.txt -o /tmp/req/o64.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 2>&1 | grep -E "^run: [0-9]"
el bench
LOG_DIR=$OUT BUILD_DIR=build-device PRECISION=bf16 PROFILE_STEPS=2 scripts/device_check.sh profile
el profiled
for f in $OUT/profile-*.csv; do gzip -9 $f; done
ls -la $OUT
