#!/bin/bash
# The bf16 attention kernel against the tree before it (exp/base), one H200, synthetic 20b, bf16.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
(cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j8 --target run parity-bench parity-synth parity-trace parity_tests 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P1=$!
(cd exp/base && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j8 --target run parity-bench 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P2=$!
wait $P1 $P2
el built
M=/tmp/parity-models; mkdir -p $M /tmp/req
timeout 60 build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
make_requests 64 20 400 /tmp/req/m64.txt; make_requests 16 1600 1700 /tmp/req/long16.txt
python3 scripts/bench_requests.py --mix prefill-heavy --count 128 --out /tmp/req/ph.jsonl
el ready
for tree in base new; do
  B=build-device/bin; [ $tree = base ] && B=exp/base/build-device/bin
  echo "== $tree batch 1, positions 0..127"
  timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision bf16 --positions 128 --warmup 16 -q 2>&1 | grep -E "median" | head -2
  echo "== $tree batch 1 from position 4000"
  timeout 60 $B/parity-bench --model 20b --models-dir $M --backend hip --precision bf16 --batch 1 --start 4000 --positions 64 --warmup 8 -q 2>&1 | grep -E "median" | head -2
  run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
  echo "== $tree 64 requests"
  timeout 90 "${run[@]}" -i /tmp/req/m64.txt -o /tmp/req/$tree-64.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 2>&1 | grep -E "^run: [0-9]|decode|TPOT" | head -4
  echo "== $tree prefill 16 x 1650"
  timeout 90 "${run[@]}" -i /tmp/req/long16.txt -o /tmp/req/$tree-long.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 2>&1 | grep -E "^run: [0-9]|prefill" | head -3
  echo "== $tree prefill-heavy 128 x (4000 in, 200 out)"
  timeout 150 "${run[@]}" -i /tmp/req/ph.jsonl -o /tmp/req/$tree-ph.txt --context 4224 2>&1 | grep -E "^run: [0-9]|^run: limits|prefill|TTFT|total" | head -6
  el $tree
done
echo "== new kernel times, prefill 16 x 1650 and 64 requests"
timeout 60 build-device/bin/run $M/20b --backend hip --precision bf16 -m getp --no-progress -i /tmp/req/long16.txt -o /tmp/req/kt.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 --kernel-times 2>&1 | grep -E "scores|att|qkv|mlp1|mlp2|o_proj" | head -8
timeout 60 build-device/bin/run $M/20b --backend hip --precision bf16 -m getp --no-progress -i /tmp/req/m64.txt -o /tmp/req/kt2.txt -n 128 --max-batch 64 --step-tokens 2048 --context 4096 --kernel-times 2>&1 | grep -E "scores|att|qkv|mlp1|mlp2|o_proj" | head -8
el kernel times
B=build-device/bin
timeout 100 $B/parity_tests --gtest_filter='DeviceKernels.Attention*:FusedStages.*:Lockstep.*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error|Expected|Which" | head -20
el tests
tok="1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900"
timeout 100 $B/parity-trace --model tiny --models-dir $M --tokens "$tok" --generate 8 --candidate hip --precision bf16 --out /tmp/t-tiny 2>&1 | grep -E "^(PASS|DIVERGED)|error" | cut -c1-400
for pos in 0 1000; do
  timeout 100 $B/parity-trace --model $M/20b --token 0 --pos $pos --candidate hip --precision bf16 --step 256 --out /tmp/t20-$pos > /tmp/t20-$pos.log 2>&1
  echo "20b pos $pos exit $?"; grep -E "^(PASS|DIVERGED)" /tmp/t20-$pos/report.txt | head -1 | cut -c1-300
  python3 - /tmp/t20-$pos/report.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); worst = {}
for d in j["datasets"]:
    s = (d.get("local") or {}).get("share")
    if s is not None: worst[d["stage"]] = max(worst.get(d["stage"], 0), s)
print("  local share max: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(worst.items())))
PY
done
el traces
timeout $(( 575 - ($(date +%s) - T0) )) $B/parity_tests --gtest_filter='DeviceKernels.*:EngineDevice*:DeviceRuntime*:*CandidateTest*hip*:*InjectionTest*hip_*:*Mutation*hip*:EngineTensor*:TraceGroup*' --gtest_brief=1 2>&1 | grep -E "FAILED|tests ran|PASSED" | head -30
for n in 64 long ph; do echo "requests whose tokens differ base/new ($n): $(diff <(cut -f1 /tmp/req/base-$n.txt) <(cut -f1 /tmp/req/new-$n.txt) | grep -c '^<' || true)"; done
el end
