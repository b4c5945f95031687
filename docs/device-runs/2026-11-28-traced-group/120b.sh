#!/bin/bash
# The 120b split over two GPUs: synth, traces, batch-1 and 64-request decode.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PARITY_MODELS_DIR=/tmp/parity-models
[ -x build-device/bin/parity-trace ] || timeout 300 bash -c 'cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j32 --target run parity-synth parity-trace 2>&1 | tail -1'
date
if [ ! -f /tmp/parity-models/120b/config.json ]; then
  /usr/bin/time -f "synth 120b: %e s" timeout 400 build-device/bin/parity-synth --preset 120b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/120b > /dev/null
  du -sh /tmp/parity-models/120b
fi
date
for step in ${STEPS}; do
  case $step in
    trace-*)
      IFS=- read -r _ prec pos mode <<< "$step"
      echo "== 120b $prec TP2 pos $pos $mode"
      extra=(); [ "$mode" = skip ] && extra=(--skip-reference-prefix)
      timeout 240 build-device/bin/parity-trace --model 120b --candidate hip --precision $prec --tensor-parallel 2 --token 5 --pos $pos "${extra[@]}" --out /tmp/t120-$step 2>&1 | grep -E "PASS|DIVERGED|timing|error" | cut -c1-400
      ;;
    bench-*)
      IFS=- read -r _ tp n <<< "$step"
      mkdir -p /tmp/req; make_requests $n 20 400 /tmp/req/m-$n.txt
      echo "== 120b bf16 TP$tp $n requests"
      tpa=(); [ "$tp" -gt 1 ] && tpa=(--tensor-parallel $tp)
      if [ $n = 1 ]; then gen=256; else gen=128; fi
      timeout 240 build-device/bin/run /tmp/parity-models/120b --backend hip --precision bf16 "${tpa[@]}" -m getp --no-progress -i /tmp/req/m-$n.txt -o /tmp/req/o-$tp-$n.txt -n $gen --max-batch $n --step-tokens 2048 --context 4096 2>&1 | grep -vE "^\s*$" | tail -12
      ;;
  esac
  date
done
