#!/bin/bash
# The BF16 KV cache (bf16 precision) against the float32 cache before it (exp/base): batch 1,
# 64 and 256 requests, prefill-heavy, ShareGPT; one H200, synthetic 20b, bf16.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
(cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j10 --target run parity-bench parity-synth 2>&1 | grep -E "error:|FAILED:" -A5 | head -30) & P1=$!
(cd exp/base && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j6 --target run parity-bench 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P2=$!
M=/tmp/parity-models; mkdir -p $M /tmp/req
for n in 1 64 256; do make_requests $n 20 400 /tmp/req/m$n.txt; done
python3 scripts/bench_requests.py --mix prefill-heavy --count 128 --out /tmp/req/ph.jsonl
python3 scripts/bench_requests.py --mix sharegpt --count 1000 --out /tmp/req/sg.jsonl
wait $P1 $P2
el built
B=build-device/bin
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
el ready
for tree in base new; do
  B=build-device/bin; [ $tree = base ] && B=exp/base/build-device/bin
  echo "== $tree batch 1, positions 0..127"
  timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision bf16 --positions 128 --warmup 16 -q 2>&1 | grep -E "median" | head -2
  echo "== $tree batch 1 from position 4000"
  timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision bf16 --batch 1 --start 4000 --positions 64 --warmup 8 -q 2>&1 | grep -E "median" | head -2
  run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
  echo "== $tree 1 request, 256 tokens"
  timeout 60 "${run[@]}" -i /tmp/req/m1.txt -o /tmp/req/$tree-1.txt -n 256 --max-batch 1 2>&1 | grep -E "^run: [0-9]" | head -2
  echo "== $tree 64 requests"
  timeout 90 "${run[@]}" -i /tmp/req/m64.txt -o /tmp/req/$tree-64.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -2
  echo "== $tree 256 requests"
  timeout 90 "${run[@]}" -i /tmp/req/m256.txt -o /tmp/req/$tree-256.txt -n 128 --max-batch 256 --step-tokens 2048 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -2
  echo "== $tree prefill-heavy 128 x (4000 in, 200 out)"
  timeout 120 "${run[@]}" -i /tmp/req/ph.jsonl -o /tmp/req/$tree-ph.txt --context 4224 2>&1 | grep -E "^run: [0-9]|KV cache" | head -3
  echo "== $tree ShareGPT 1000"
  timeout 150 "${run[@]}" -i /tmp/req/sg.jsonl -o /tmp/req/$tree-sg.txt 2>&1 | grep -E "^run: [0-9]|KV cache|max-batch" | head -4
  el $tree
done
B=build-device/bin
run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
echo "== new kernel times, 64 requests"
timeout 60 "${run[@]}" -i /tmp/req/m64.txt -o /tmp/req/kt64.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 --kernel-times 2>&1 | grep -E "^(scores|qkv|mlp1|mlp2|o_proj)\b" | head -8
echo "== new 64 requests at --max-batch 3 (the tokens of --max-batch 64's run)"
timeout 90 "${run[@]}" -i /tmp/req/m64.txt -o /tmp/req/new-64-b3.txt -n 128 --max-batch 3 --step-tokens 2048 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -2
echo "requests whose tokens differ at --max-batch 64 and 3: $(diff <(cut -f1 /tmp/req/new-64.txt) <(cut -f1 /tmp/req/new-64-b3.txt) | grep -c '^<' || true) of $(wc -l < /tmp/req/new-64.txt)"
for n in 1 64 256 ph sg; do echo "requests whose tokens differ base/new ($n): $(diff <(cut -f1 /tmp/req/base-$n.txt) <(cut -f1 /tmp/req/new-$n.txt) | grep -c '^<' || true)"; done
el end
