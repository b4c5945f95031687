#!/bin/bash
# The mixed steps' decode rows on the split key tiles (78cfc29) against the split for decode
# steps only (9aed47c, exp/base): the attention tests, the serving mixes, then the device filter.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
(cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j11 2>&1 | grep -E "error:|FAILED:" -A5 | head -30) & P1=$!
(cd exp/base && cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j5 --target run 2>&1 | grep -E "error:|FAILED:" -A5 | head -20) & P2=$!
M=/tmp/parity-models; mkdir -p $M /tmp/req
python3 scripts/bench_requests.py --mix sharegpt --count 1000 --out /tmp/req/sharegpt.jsonl
python3 scripts/bench_requests.py --mix prefill-heavy --count 128 --out /tmp/req/ph.jsonl
python3 scripts/bench_requests.py --mix decode-heavy --count 256 --out /tmp/req/dh.jsonl
wait $P1 $P2
el built
B=build-device/bin
timeout 120 $B/parity_tests --gtest_filter='DeviceKernels.Attention*:StepLayout.*:ArenaLayout.*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|Expected|Which|attention heads" | head -40
el attention tests
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
el ready
for tree in base new; do
  B=build-device/bin; [ $tree = base ] && B=exp/base/build-device/bin
  run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
  echo "== $tree ShareGPT-shaped 1000"
  timeout 120 "${run[@]}" -i /tmp/req/sharegpt.jsonl -o /tmp/req/$tree-sg.txt 2>&1 | grep -E "^run: [0-9]|^run: limits" | head -3
  echo "== $tree prefill-heavy 128 x (4000 in, 200 out)"
  timeout 100 "${run[@]}" -i /tmp/req/ph.jsonl -o /tmp/req/$tree-ph.txt --context 4224 2>&1 | grep -E "^run: [0-9]" | head -2
  el $tree
done
echo "== new decode-heavy 256 x (128 in, 1024 out)"
timeout 100 build-device/bin/run $M/20b --backend hip --precision bf16 -m getp --no-progress -i /tmp/req/dh.jsonl -o /tmp/req/new-dh.txt 2>&1 | grep -E "^run: [0-9]" | head -2
for n in sg ph; do echo "requests whose tokens differ base/new ($n): $(diff <(cut -f1 /tmp/req/base-$n.txt) <(cut -f1 /tmp/req/new-$n.txt) | grep -c '^<' || true) of $(wc -l < /tmp/req/new-$n.txt)"; done
el mixes
B=build-device/bin
timeout $(( 590 - ($(date +%s) - T0) )) $B/parity_tests --gtest_filter='DeviceKernels.*:EngineDevice*:DeviceRuntime*:TraceGroup*:*CandidateTest*hip*:*InjectionTest*hip_*:*Mutation*hip*:EngineTensor*:Lockstep*:FusedStages*' --gtest_brief=1 2>&1 | grep -E "FAILED|Failure|tests ran|PASSED|error:|SKIPPED" | head -40
el end
