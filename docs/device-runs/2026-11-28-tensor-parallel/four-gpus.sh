#!/bin/bash
set -u
cd "$(dirname "$0")/.."
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a > /tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; exit 1; }
cmake --build build-device -j64 --target run parity-synth > /tmp/build.log 2>&1 || { grep -E "error" -A5 /tmp/build.log | head -40; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
B=build-device/bin
$B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/20b > /tmp/synth.log 2>&1 || tail -5 /tmp/synth.log
M=/tmp/parity-models/20b
make_requests 16 20 400 /tmp/short-16.txt
for tp in 1 4; do
  timeout 60 $B/run $M --backend hip --precision fp32 --tensor-parallel $tp -m getp --no-progress -i /tmp/short-16.txt -n 64 --max-batch 16 --step-tokens 4096 --kv-memory 8G -o /tmp/s16-$tp.txt 2>&1 | grep -E "^run: [0-9]|rror" | head -2
done
cmp /tmp/s16-1.txt /tmp/s16-4.txt && echo "20b fp32: tp4 tokens == tp1"
make_requests 64 20 400 /tmp/short-64.txt
for tp in 1 2 4; do
  echo "== bf16 tp$tp 64"
  timeout 60 $B/run $M --backend hip --precision bf16 --tensor-parallel $tp -m getp --no-progress -i /tmp/short-64.txt -n 128 --max-batch 64 --step-tokens 4096 --kv-memory 8G -o /tmp/x.txt 2>&1 | grep -E "^run: [0-9]|rror" | head -2
done
echo "done $(( $(date +%s) - T0 )) s"
