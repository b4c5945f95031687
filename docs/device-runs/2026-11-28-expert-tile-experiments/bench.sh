#!/bin/bash
# The 64 x 128 warpgroup expert tiles against the tree before (exp/base), and the projections on
# the same shape (exp/projwide); one H200, synthetic 20b, bf16.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
(cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j8 --target run parity-synth parity_tests 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P1=$!
(cd exp/base && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j4 --target run 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P2=$!
(cd exp/projwide && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j4 --target run 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P3=$!
wait $P1 $P2 $P3
el built
B=build-device/bin
timeout 150 $B/parity_tests --gtest_filter='DeviceKernels.MoeTilings*:DeviceKernels.MoeBf16*:DeviceKernels.Warpgroup*:DeviceKernels.Gemv*:MoeTilingChoice.*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|SKIPPED|bits|Expected" | head -20
el tests
timeout 90 compute-sanitizer --error-exitcode 9 --print-limit 20 --tool racecheck $B/parity_tests --gtest_filter='DeviceKernels.MoeTilingsAgreeInBf16SmallShapes' --gtest_brief=1 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" | head
timeout 60 compute-sanitizer --error-exitcode 9 --print-limit 20 --tool memcheck $B/parity_tests --gtest_filter='DeviceKernels.MoeTilingsAgreeInBf16SmallShapes' --gtest_brief=1 2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | head
el sanitize
M=/tmp/parity-models; mkdir -p $M /tmp/req
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
make_requests 16 1600 1700 /tmp/req/long16.txt
python3 scripts/bench_requests.py --mix prefill-heavy --count 128 --out /tmp/req/ph.jsonl
el ready
for tree in base new projwide; do
  B=build-device/bin; [ $tree != new ] && B=exp/$tree/build-device/bin
  run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
  echo "== $tree prefill 16 x 1650"
  timeout 60 "${run[@]}" -i /tmp/req/long16.txt -o /tmp/req/$tree-long.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -3
  timeout 60 "${run[@]}" -i /tmp/req/long16.txt -o /tmp/req/$tree-long.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 2>&1 | grep -E "^run: [0-9]" | head -3
  echo "== $tree prefill-heavy 128 x (4000 in, 200 out)"
  timeout 100 "${run[@]}" -i /tmp/req/ph.jsonl -o /tmp/req/$tree-ph.txt --context 4224 2>&1 | grep -E "^run: [0-9]" | head -6
  el $tree
done
for tree in new projwide; do
  B=build-device/bin; [ $tree != new ] && B=exp/$tree/build-device/bin
  echo "== $tree kernel times, prefill 16 x 1650"
  timeout 60 $B/run $M/20b --backend hip --precision bf16 -m getp --no-progress -i /tmp/req/long16.txt -o /tmp/req/kt.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 --kernel-times 2>&1 | grep -E "scores|qkv|mlp1|mlp2|o_proj|router|lm_head|total" | head -12
done
for n in long ph; do for tree in new projwide; do echo "requests whose tokens differ base/$tree ($n): $(diff <(cut -f1 /tmp/req/base-$n.txt) <(cut -f1 /tmp/req/$tree-$n.txt) | grep -c '^<' || true)"; done; done
el end
