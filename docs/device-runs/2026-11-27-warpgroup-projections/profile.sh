#!/usr/bin/env bash
# Where a bf16 step's time goes: per-stage kernel times at decode batch 64/256/512 and prefill;
# the mutation suite on the bf16 path.
set -uo pipefail
export LOG_DIR=$OUT/logs
mkdir -p $LOG_DIR
scripts/device_check.sh build || exit 1
export LD_LIBRARY_PATH=$PWD/build-devdeps/lib
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
M=/tmp/parity-models/20b
build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M > /dev/null
R=/tmp/req; mkdir -p $R
make_requests 64 5 10 $R/short-64.txt
make_requests 256 5 10 $R/short-256.txt
make_requests 512 5 10 $R/short-512.txt
make_requests 16 1600 1700 $R/long-16.txt
make_requests 8 3300 3400 $R/long4k-8.txt
run=(build-device/bin/run $M --backend hip --precision bf16 -m getp --no-progress)
for n in 64 256 512; do
  echo "=== decode $n" ; "${run[@]}" -i $R/short-$n.txt -o /tmp/o.txt -n 192 --max-batch $n --step-tokens 4096 --kernel-times 2>&1 | tail -40
done > $OUT/decode-kernel-times.txt
{ echo "=== prefill 16x1650"; "${run[@]}" -i $R/long-16.txt -o /tmp/o.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 --kernel-times 2>&1 | tail -40
  echo "=== prefill 8x4000"; "${run[@]}" -i $R/long4k-8.txt -o /tmp/o.txt -n 1 --max-batch 8 --step-tokens 4096 --context 4224 --kernel-times 2>&1 | tail -40
} > $OUT/prefill-kernel-times.txt
timeout 400 build-device/bin/parity_tests --gtest_filter='Mutations/MutationTest.*/hip*' > $OUT/mutations.txt 2>&1
tail -3 $OUT/mutations.txt
