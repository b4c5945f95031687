#!/bin/bash
# Four GPUs: the peer all-reduce's tests over 3 and 4 ranks, the 120b traced at TP 4, the 120b and
# 20b at TP 1/2/4, and data parallel over groups (--gpus 4 --tensor-parallel 2).
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nvidia-smi topo -m | head -6
export PARITY_MODELS_DIR=/tmp/parity-models
date
timeout 400 bash -c 'cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j64 --target run parity-synth parity-trace parity_tests 2>&1 | grep -E "error|FAILED" -A5 | head -30; cmake --build build-device -j64 --target run parity-synth parity-trace parity_tests 2>&1 | tail -1'
date
synth() { [ -f /tmp/parity-models/$1/config.json ] && return
  /usr/bin/time -f "synth $1: %e s" timeout 400 build-device/bin/parity-synth --preset $1 --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/$1 > /dev/null; }
bench() {  # bench MODEL PREC TP GPUS N GEN
  local model=$1 prec=$2 tp=$3 gpus=$4 n=$5 gen=$6
  mkdir -p /tmp/req; [ -f /tmp/req/m-$n.txt ] || make_requests $n 20 400 /tmp/req/m-$n.txt
  echo "== $model $prec TP$tp gpus $gpus, $n requests x $gen"
  timeout 240 build-device/bin/run /tmp/parity-models/$model --backend hip --precision $prec --tensor-parallel $tp --gpus $gpus -m getp --no-progress -i /tmp/req/m-$n.txt -o /tmp/req/o-$model-$prec-$tp-$gpus-$n-$gen.txt -n $gen --max-batch $n --step-tokens 2048 --context 4096 --kv-memory 16G 2>&1 | grep -E "TPOT|tensor parallel over|engines|error" | head -6
}
for step in ${STEPS}; do
  case $step in
    tests) echo "== tests"; timeout 500 build-device/bin/parity_tests --gtest_filter='PeerGroup.*:NcclGroup.*:EngineTensorParallel.*:TraceGroup.*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|Failure|error" | grep -v blamed | head -30 ;;
    synth-*) synth ${step#synth-} ;;
    bench-*) IFS=- read -r _ model prec tp gpus n gen <<< "$step"; bench $model $prec $tp $gpus $n $gen ;;
    same-*) IFS=- read -r _ a b <<< "$step"; cmp /tmp/req/o-$a.txt /tmp/req/o-$b.txt && echo "tokens identical: $a and $b" ;;
    trace-*) IFS=- read -r _ model prec tp pos mode <<< "$step"
      echo "== trace $model $prec TP$tp pos $pos $mode"
      extra=(); [ "$mode" = skip ] && extra=(--skip-reference-prefix)
      timeout 300 build-device/bin/parity-trace --model $model --candidate hip --precision $prec --tensor-parallel $tp --token 5 --pos $pos "${extra[@]}" --out /tmp/t-$step 2>&1 | grep -E "PASS|DIVERGED|error" | cut -c1-300 ;;
  esac
  date
done
