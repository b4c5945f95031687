#!/usr/bin/env bash
# transformers as a candidate (python/parity_capture/hf.py): golden/hf-tiny and the synthetic 20b
# in float64, float32 and bfloat16 on the GPU, each capture diffed against the reference; and the
# engine's batch-1 decode at the positions parity-bench measures. Runs in /tmp/src.
set -uo pipefail
bin=build-device/bin
M=/tmp/parity-models
export PYTHONPATH=$PWD/python
py=python3
$py -c "import h5py, numpy, torch, transformers; print('h5py', h5py.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
tiny_tokens="$(seq -s, 3 7 200)"
for dt in float64 float32 bfloat16; do
  echo "== hf-tiny $dt"
  $py -m parity_capture.hf golden/hf-tiny --tokens "$tiny_tokens" --dtype $dt --device cuda --out $OUT/hf-tiny-$dt.h5 2>&1 | tail -3
  $bin/parity-trace --model golden/hf-tiny --candidate-trace $OUT/hf-tiny-$dt.h5 --out $OUT/hf-tiny-$dt >/dev/null 2>&1; echo "parity-trace exit $?"
  grep -E "^(PASS|DIVERGED)|first divergence" $OUT/hf-tiny-$dt/report.txt | head -4; python3 build-devdeps/stage_summary.py $OUT/hf-tiny-$dt/report.json
  $bin/parity-trace --model golden/hf-tiny --candidate-trace $OUT/hf-tiny-$dt.h5 --tolerance derived --out $OUT/hf-tiny-$dt-derived >/dev/null 2>&1; echo "derived: exit $?"
  grep -E "^(PASS|DIVERGED)" $OUT/hf-tiny-$dt-derived/report.txt | head -3
done
[ -f $M/20b/config.json ] || $bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b >/dev/null
t20="200006,1428,200008,12194,11,3575,0,6437,382,290,11145,30,200007,200006,173781"
for dt in float32 bfloat16; do  # float64 would need 168 GB
  echo "== 20b $dt"
  timeout 400 $py -m parity_capture.hf $M/20b --tokens "$t20" --dtype $dt --device cuda --out $OUT/20b-$dt.h5 2>&1 | tail -3
  $bin/parity-trace --model $M/20b --candidate-trace $OUT/20b-$dt.h5 --out $OUT/20b-$dt >/dev/null 2>&1; echo "parity-trace exit $?"
  grep -E "^(PASS|DIVERGED)|first divergence" $OUT/20b-$dt/report.txt | head -4; python3 build-devdeps/stage_summary.py $OUT/20b-$dt/report.json
  $bin/parity-trace --model $M/20b --candidate-trace $OUT/20b-$dt.h5 --tolerance derived --out $OUT/20b-$dt-derived >/dev/null 2>&1; echo "derived: exit $?"
  grep -E "^(PASS|DIVERGED)" $OUT/20b-$dt-derived/report.txt | head -3
done
echo "== batch 1 at positions 0-128: run (a one-token prompt, 128 tokens) and parity-bench"
echo "The" > /tmp/one.txt
for i in 1 2; do $bin/run $M/20b --backend hip -m getp --no-progress -i /tmp/one.txt -o /tmp/one-out.txt -n 129 --max-batch 1 2>&1 | grep "^run: "; done
$bin/parity-bench --model 20b --models-dir $M --backend hip --positions 128 --warmup 16 -q 2>&1 | grep -E "median|floor"
find $OUT -name "*.h5" -delete
