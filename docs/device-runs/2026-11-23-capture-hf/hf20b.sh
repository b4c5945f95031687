#!/usr/bin/env bash
# transformers in float32 on the synthetic 20b through the capture API (needs > 84 GB: an H200).
set -uo pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p /tmp/src && tar -xzf $R/build-devdeps/src.tar.gz -C /tmp/src && cp -r $R/build-devdeps /tmp/src/
cd /tmp/src && LOG_DIR=$OUT GPU=cuda bash scripts/device_check.sh build >/dev/null || exit 1
M=/tmp/parity-models
build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b >/dev/null
export PYTHONPATH=/tmp/src/python
t20="200006,1428,200008,12194,11,3575,0,6437,382,290,11145,30,200007,200006,173781"
python3 -m parity_capture.hf $M/20b --tokens "$t20" --dtype float32 --device cuda --out /tmp/20b-f32.h5 2>&1 | grep -v "Loading weights" | tail -3
build-device/bin/parity-trace --model $M/20b --candidate-trace /tmp/20b-f32.h5 --out /tmp/20b-f32 >/dev/null 2>&1; echo "parity-trace exit $?"
grep -E "^(PASS|DIVERGED)" /tmp/20b-f32/report.txt | head -2
python3 build-devdeps/stage_summary.py /tmp/20b-f32/report.json
cp /tmp/20b-f32/report.txt $OUT/20b-float32-report.txt
