#!/bin/bash
# 120b batch 1 over two GPUs: where a token's time goes (per-stage kernel times), one GPU beside.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
nvidia-smi topo -m | head -4
timeout 300 bash -c 'cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j32 --target run parity-synth 2>&1 | tail -1'
date
timeout 200 build-device/bin/parity-synth --preset 120b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/m/120b > /dev/null
date
mkdir -p /tmp/req; make_requests 1 20 400 /tmp/req/m-1.txt
for tp in 2 1; do
  tpa=(); [ "$tp" -gt 1 ] && tpa=(--tensor-parallel $tp)
  echo "== 120b bf16 TP$tp batch 1, kernel times"
  timeout 150 build-device/bin/run /tmp/m/120b --backend hip --precision bf16 "${tpa[@]}" -m getp --no-progress -i /tmp/req/m-1.txt -o /tmp/req/o.txt -n 128 --max-batch 1 --step-tokens 2048 --context 4096 --kernel-times 2>&1 | grep -vE "^\s*$" | grep -vE "^  (weights|KV cache|activations|total)" | tail -40
  date
done
