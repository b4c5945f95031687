#!/usr/bin/env bash
set -uo pipefail
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
(cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j16 --target run parity-synth > $OUT/build.log 2>&1) || { tail -30 $OUT/build.log; exit 1; }
B=build-device/bin
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
M=/tmp/parity-models/20b
[ -f $M/config.json ] || $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M > /dev/null
R=/tmp/req; mkdir -p $R
for n in 32 64 128 256; do make_requests $n 5 10 $R/short-$n.txt; done
run=($B/run $M --backend hip --precision bf16 -m getp --no-progress)
for round in 1 2; do
for d in 1 2 3; do
  for n in 32 64 128 256; do
    echo "=== d$d round $round decode $n"
    EXP_MOE_NT2=4 EXP_DEPTH=$d "${run[@]}" -i $R/short-$n.txt -o $OUT/d$d-$n.txt -n 128 --max-batch $n --step-tokens 4096 2>&1 | grep '^run: [0-9]'
  done
done
done > $OUT/ab.txt 2>&1
for d in 2 3; do for n in 32 64 128 256; do cmp -s $OUT/d1-$n.txt $OUT/d$d-$n.txt && echo "same d$d $n" || echo "DIFF d$d $n"; done; done >> $OUT/ab.txt
for d in 1 2 3; do for n in 64 256; do
  echo "=== d$d decode $n kernel times"; EXP_MOE_NT2=4 EXP_DEPTH=$d "${run[@]}" -i $R/short-$n.txt -o /tmp/o.txt -n 128 --max-batch $n --step-tokens 4096 --kernel-times 2>&1 | sed -n '/kernels of/,$p' | head -6
done; done > $OUT/kernel-times.txt 2>&1
timeout 200 ncu --kernel-name regex:'attention_decode' --launch-skip 240 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
  "${run[@]}" -i $R/short-64.txt -o /tmp/o.txt -n 16 --max-batch 64 --step-tokens 4096 > $OUT/ncu-attn.txt 2>&1
cat $OUT/ab.txt $OUT/kernel-times.txt; grep -E "Duration|Registers|Block Size|Grid Size|Achieved Occ|Theoretical Occ|Warp Cycles Per Issued|Memory Throughput|Compute \(SM\)|Waves|Shared Memory Config|Dynamic Shared|Static Shared|Stall|One or More" $OUT/ncu-attn.txt | head -40
