#!/bin/bash
# The BF16 cache's value staging: lanes by key pairs (exp/a: the committed kernel) or by row octets
# (the working tree then: coalesced loads, 8-way bank conflicts on the transposed stores), batch
# 1 and the attention's kernel times; the tree before (exp/base) beside them, two rounds.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
(cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j8 --target run parity-bench parity-synth 2>&1 | grep -E "error:|FAILED:" -A5 | head -30) & P1=$!
(cd exp/a && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j8 --target run parity-bench 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P2=$!
(cd exp/base && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j4 --target parity-bench 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P3=$!
M=/tmp/parity-models; mkdir -p $M /tmp/req
make_requests 1 20 400 /tmp/req/m1.txt; make_requests 64 20 400 /tmp/req/m64.txt
wait $P1 $P2 $P3
el built
timeout 60 build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
for round in 1 2; do
for tree in base a b; do
  B=build-device/bin; [ $tree = a ] && B=exp/a/build-device/bin; [ $tree = base ] && B=exp/base/build-device/bin
  echo "== $tree batch 1 (round $round): positions 0..127, from 4000"
  timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision bf16 --positions 128 --warmup 16 -q 2>&1 | grep -E "median" | head -1
  timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision bf16 --batch 1 --start 4000 --positions 64 --warmup 8 -q 2>&1 | grep -E "median" | head -1
done
done
for tree in a b; do
  B=build-device/bin; [ $tree = a ] && B=exp/a/build-device/bin
  run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
  echo "== $tree kernel times, 1 request, 64 requests"
  timeout 60 "${run[@]}" -i /tmp/req/m1.txt -o /tmp/req/kt1.txt -n 256 --max-batch 1 --kernel-times 2>&1 | grep -E "^(scores|q_rope)\b" | head -3
  timeout 60 "${run[@]}" -i /tmp/req/m64.txt -o /tmp/req/kt64.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 --kernel-times 2>&1 | grep -E "^(scores|q_rope)\b" | head -3
done
el end
