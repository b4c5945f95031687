#!/bin/bash
# The fp32 path and the bf16 prefill before (505bfdc, exp/base) and after (78cfc29) the split-key
# decode attention; one H200, synthetic 20b.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
(cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j8 --target run parity-bench parity-synth 2>&1 | grep -E "error:|FAILED:" -A5 | head -30) & P1=$!
(cd exp/base && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j8 --target run parity-bench 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P2=$!
M=/tmp/parity-models; mkdir -p $M /tmp/req
make_requests 64 20 400 /tmp/req/m64.txt; make_requests 16 1600 1700 /tmp/req/long16.txt
wait $P1 $P2
el built
timeout 60 build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
el ready
for tree in base new; do
  B=build-device/bin; [ $tree = base ] && B=exp/base/build-device/bin
  echo "== $tree fp32 batch 1, positions 0..127"
  timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision fp32 --positions 128 --warmup 16 -q 2>&1 | grep -E "median" | head -1
  echo "== $tree fp32 64 requests"
  timeout 60 $B/run $M/20b --backend hip --precision fp32 -m getp --no-progress -i /tmp/req/m64.txt -o /tmp/req/$tree-64-fp32.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -1
  echo "== $tree bf16 prefill 16 x 1650"
  for i in 1 2; do timeout 60 $B/run $M/20b --backend hip --precision bf16 -m getp --no-progress -i /tmp/req/long16.txt -o /tmp/req/$tree-long.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -1; done
  el $tree
done
echo "requests whose tokens differ base/new (fp32, 64): $(diff <(cut -f1 /tmp/req/base-64-fp32.txt) <(cut -f1 /tmp/req/new-64-fp32.txt) | grep -c '^<' || true)"
el end
