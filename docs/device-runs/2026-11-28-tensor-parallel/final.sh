#!/bin/bash
set -u
cd "$(dirname "$0")/.."
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a > /tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; exit 1; }
cmake --build build-device -j32 --target run parity-synth > /tmp/build.log 2>&1 || { grep -E "error" -A5 /tmp/build.log | head -40; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
B=build-device/bin
mkdir -p /tmp/m
make_requests 24 5 60 /tmp/req24.txt
for p in fp32 bf16; do
  for tp in 1 2; do
    timeout 60 $B/run tiny --models-dir /tmp/m --backend hip --precision $p --tensor-parallel $tp -m getp --no-progress -i /tmp/req24.txt -n 32 --kv-memory 1G -o /tmp/tiny-$p-$tp.txt 2>/tmp/tiny-$p-$tp.err || { echo "tiny $p tp$tp failed"; grep -v "^ " /tmp/tiny-$p-$tp.err | tail -3; }
  done
  cmp /tmp/tiny-$p-1.txt /tmp/tiny-$p-2.txt && echo "tiny $p: tp2 tokens == tp1"
done
echo "--- refusals"
for args in "--tensor-parallel 3" "--tensor-parallel 2 --gpus 3"; do
  $B/run tiny --models-dir /tmp/m --backend hip $args -m getp -i /tmp/req24.txt -o /tmp/x.txt 2>&1 | tail -1; echo "exit ${PIPESTATUS[0]}"
done
$B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/20b > /tmp/synth.log 2>&1 || tail -5 /tmp/synth.log
M=/tmp/parity-models/20b
make_requests 16 20 400 /tmp/short-16.txt
for tp in 1 2; do
  timeout 100 $B/run $M --backend hip --precision fp32 --tensor-parallel $tp -m getp --no-progress -i /tmp/short-16.txt -n 64 --max-batch 16 --step-tokens 4096 --kv-memory 8G -o /tmp/s16-$tp.txt 2>&1 | grep -E "^run: [0-9]|rror" | head -2
done
cmp /tmp/s16-1.txt /tmp/s16-2.txt && echo "20b fp32: tp2 tokens == tp1"
echo "done $(( $(date +%s) - T0 )) s"
