#!/usr/bin/env bash
set -uo pipefail
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
rm -rf build-device
(cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j16 --target run parity-synth > $OUT/build.log 2>&1) || { tail -30 $OUT/build.log; exit 1; }
B=build-device/bin
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
M=/tmp/parity-models/20b
$B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M > /dev/null
R=/tmp/req; mkdir -p $R
for n in 64 128 256 512; do make_requests $n 5 10 $R/short-$n.txt; done
run=($B/run $M --backend hip --precision bf16 -m getp --no-progress)
declare -A cfg=(
 [base]=""
 [nt2_4]="EXP_MOE_NT2=4"
 [nt2_4_wg24]="EXP_MOE_NT2=4 EXP_MOE_WG=24"
 [wg12]="EXP_MOE_WG=12"
 [gemv_nt8]="EXP_GEMV_NT8=1"
 [wgblk32]="EXP_WG_BLOCKS=32"
 [nt1w_4]="EXP_MOE_NT1W=4"
)
for name in base nt2_4 nt2_4_wg24 wg12 gemv_nt8 wgblk32 nt1w_4; do
  for n in 64 128 256 512; do
    echo "=== $name decode $n"
    env ${cfg[$name]} "${run[@]}" -i $R/short-$n.txt -o $OUT/$name-$n.txt -n 128 --max-batch $n --step-tokens 4096 2>&1 | grep '^run: [0-9]'
  done
done > $OUT/ab.txt 2>&1
for name in nt2_4 nt2_4_wg24 wg12 gemv_nt8 wgblk32 nt1w_4; do for n in 64 128 256 512; do cmp -s $OUT/base-$n.txt $OUT/$name-$n.txt && echo "same $name $n" || echo "DIFF $name $n"; done; done >> $OUT/ab.txt
for name in base nt2_4 gemv_nt8; do for n in 64 128; do
  echo "=== $name decode $n kernel times"; env ${cfg[$name]} "${run[@]}" -i $R/short-$n.txt -o /tmp/o.txt -n 128 --max-batch $n --step-tokens 4096 --kernel-times 2>&1 | sed -n '/kernels of/,$p' | head -12
done; done > $OUT/kernel-times.txt 2>&1
cat $OUT/ab.txt $OUT/kernel-times.txt
