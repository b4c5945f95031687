#!/bin/bash
# The peer-store all-reduce on two GPUs: tests, then A/B against NCCL on the 20b and 120b.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nvidia-smi topo -m | head -4
export PARITY_MODELS_DIR=/tmp/parity-models
date
timeout 400 bash -c 'cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j32 --target run parity-synth parity-trace parity_tests 2>&1 | grep -E "error|FAILED" -A5 | head -30; cmake --build build-device -j32 --target run parity-synth parity-trace parity_tests 2>&1 | tail -1'
date
echo "== tests"
timeout 400 build-device/bin/parity_tests --gtest_filter='PeerGroup.*:NcclGroup.*:EngineTensorParallel.*:TraceGroup.*:DeviceKernels.RankSum*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|Failure|error" | head -40
date
synth() {  # synth PRESET
  [ -f /tmp/parity-models/$1/config.json ] && return
  /usr/bin/time -f "synth $1: %e s" timeout 400 build-device/bin/parity-synth --preset $1 --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/$1 > /dev/null
}
bench() {  # bench MODEL TP ALLREDUCE N
  local model=$1 tp=$2 ar=$3 n=$4
  mkdir -p /tmp/req; [ -f /tmp/req/m-$n.txt ] || make_requests $n 20 400 /tmp/req/m-$n.txt
  local tpa=(); [ "$tp" -gt 1 ] && tpa=(--tensor-parallel $tp --all-reduce $ar)
  local gen=128; [ $n = 1 ] && gen=256
  echo "== $model bf16 TP$tp $ar $n requests"
  timeout 240 build-device/bin/run /tmp/parity-models/$model --backend hip --precision bf16 "${tpa[@]}" -m getp --no-progress -i /tmp/req/m-$n.txt -o /tmp/req/o-$model-$tp-$ar-$n.txt -n $gen --max-batch $n --step-tokens 2048 --context 4096 --kv-memory 16G 2>&1 | grep -E "TPOT|decode|output|tensor parallel over|error" | head -8
}
for step in ${STEPS}; do
  case $step in
    synth-*) synth ${step#synth-} ;;
    bench-*) IFS=- read -r _ model tp ar n <<< "$step"; bench $model $tp $ar $n ;;
    same-*) IFS=- read -r _ model n <<< "$step"
      cmp /tmp/req/o-$model-2-peer-$n.txt /tmp/req/o-$model-2-nccl-$n.txt && echo "$model $n: peer and nccl tokens identical" ;;
    trace-*) IFS=- read -r _ model prec pos mode <<< "$step"
      echo "== trace $model $prec TP2 pos $pos $mode"
      extra=(); [ "$mode" = skip ] && extra=(--skip-reference-prefix)
      timeout 300 build-device/bin/parity-trace --model $model --candidate hip --precision $prec --tensor-parallel 2 --token 5 --pos $pos "${extra[@]}" --out /tmp/t-$step 2>&1 | grep -E "PASS|DIVERGED|error|all-reduce|gathered" | cut -c1-300 ;;
  esac
  date
done
