#!/bin/bash
# The 120b and the 20b on one and two H200s with main's kernels (split-key decode attention, the
# BF16 KV cache): batch 1 and 64 requests, bf16, the peer all-reduce; the 120b's kernel times at
# batch 1 over two GPUs.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build build-device -j32 --target run parity-synth 2>&1 | grep -E "error:|FAILED" -A5 | head -30
el built
mkdir -p /tmp/req /tmp/parity-models; make_requests 1 20 400 /tmp/req/m-1.txt; make_requests 64 20 400 /tmp/req/m-64.txt
synth() { /usr/bin/time -f "synth $1: %e s" timeout 200 build-device/bin/parity-synth --preset $1 --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/$1 > /dev/null; }
bench() {  # bench MODEL TP N [extra]
  local tpa=(); [ "$2" -gt 1 ] && tpa=(--tensor-parallel $2 --all-reduce peer)
  local gen=128; [ $3 = 1 ] && gen=256
  echo "== $1 bf16 TP$2 $3 requests ${4:-}"
  timeout 120 build-device/bin/run /tmp/parity-models/$1 --backend hip --precision bf16 "${tpa[@]}" -m getp --no-progress -i /tmp/req/m-$3.txt -o /tmp/req/o-$1-$2-$3.txt -n $gen --max-batch $3 --step-tokens 2048 --context 4096 --kv-memory 16G ${4:-} 2>&1 | grep -E "TPOT|error|^(attn_norm|qkv|q_rope|scores|o_proj|ffn_norm|router|mlp1|mlp2|moe_out|logits|final_norm|sampled) " | head -16
}
synth 20b
bench 20b 1 1; bench 20b 2 1
el 20b
synth 120b
el synth
bench 120b 1 1; bench 120b 2 1; bench 120b 2 64
bench 120b 2 1 --kernel-times
el end
