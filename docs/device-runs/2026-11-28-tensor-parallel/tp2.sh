#!/bin/bash
set -u
cd "$(dirname "$0")/.."
L=$OUT/log; exec > >(tee -a $L) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
T0=$(date +%s)
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a > /tmp/cmake.log 2>&1 || { tail -30 /tmp/cmake.log; exit 1; }
cmake --build build-device -j32 --target run parity-synth > /tmp/build.log 2>&1 || { grep -E "error" -A5 /tmp/build.log | head -40; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
B=build-device/bin
mkdir -p /tmp/m
make_requests 24 5 60 /tmp/req24.txt
timeout 60 $B/run tiny --models-dir /tmp/m --backend hip --no-graphs --precision fp32 --tensor-parallel 2 -m getp --no-progress -i /tmp/req24.txt -n 4 --kv-memory 1G -o /tmp/x.txt 2>&1 | grep -v "^ " | tail -4; echo "rc ${PIPESTATUS[0]}"
for p in fp32 bf16; do
  for tp in 1 2; do
    timeout 60 $B/run tiny --models-dir /tmp/m --backend hip --precision $p --tensor-parallel $tp -m getp --no-progress -i /tmp/req24.txt -n 32 --kv-memory 1G -o /tmp/tiny-$p-$tp.txt 2>/tmp/tiny-$p-$tp.err || { echo "tiny $p tp$tp failed"; grep -v "^ " /tmp/tiny-$p-$tp.err | tail -3; }
  done
  cmp /tmp/tiny-$p-1.txt /tmp/tiny-$p-2.txt && echo "tiny $p: tp2 tokens == tp1"
done
grep -h "run: " /tmp/tiny-bf16-2.err | tail -3
echo "--- 20b synth $(( $(date +%s) - T0 )) s"
$B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/20b > /tmp/synth.log 2>&1 || tail -5 /tmp/synth.log
M=/tmp/parity-models/20b
make_requests 64 20 400 /tmp/short-64.txt
make_requests 1 20 400 /tmp/short-1.txt
for tp in 2 1; do
  echo "=== 20b bf16 tp$tp $(( $(date +%s) - T0 )) s"
  timeout 100 $B/run $M --backend hip --precision bf16 --tensor-parallel $tp -m getp --no-progress -i /tmp/short-1.txt -n 256 --max-batch 1 --step-tokens 4096 --kv-memory 8G -o /tmp/b1-$tp.txt 2>&1 | grep -E "^run: [0-9]|rror" | head -3
  timeout 100 $B/run $M --backend hip --precision bf16 --tensor-parallel $tp -m getp --no-progress -i /tmp/short-64.txt -n 128 --max-batch 64 --step-tokens 4096 --kv-memory 8G -o /tmp/d64-$tp.txt 2>&1 | grep -E "^run: [0-9]|rror" | head -3
done
for f in b1 d64; do cmp -s /tmp/$f-1.txt /tmp/$f-2.txt && echo "$f: tp2 tokens == tp1" || echo "$f: differ in $(diff /tmp/$f-1.txt /tmp/$f-2.txt | grep -c '^<') of $(wc -l < /tmp/$f-1.txt) lines"; done
echo "done $(( $(date +%s) - T0 )) s"
