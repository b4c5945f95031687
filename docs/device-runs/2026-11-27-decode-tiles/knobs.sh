#!/usr/bin/env bash
set -uo pipefail
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
(cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j16 --target run parity-synth > $OUT/build.log 2>&1) || { tail -30 $OUT/build.log; exit 1; }
B=build-device/bin
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
M=/tmp/parity-models/20b
[ -f $M/config.json ] || $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M > /dev/null
R=/tmp/req; mkdir -p $R
for n in 32 64 128; do make_requests $n 5 10 $R/short-$n.txt; done
run=($B/run $M --backend hip --precision bf16 -m getp --no-progress)
declare -A cfg=([base]="" [gv1]="EXP_GEMV=1" [gv2]="EXP_GEMV=2" [gv3]="EXP_GEMV=3" [moe3]="EXP_MOE_MINB=3" [moe5]="EXP_MOE_MINB=5" [attn1k]="EXP_ATTN_MINB=1024")
names="base gv1 gv2 gv3 moe3 moe5 attn1k"
for round in 1 2; do for name in $names; do for n in 32 64 128; do
  echo "=== $name round $round decode $n"
  env EXP_MOE_NT2=4 ${cfg[$name]} "${run[@]}" -i $R/short-$n.txt -o $OUT/$name-$n.txt -n 128 --max-batch $n --step-tokens 4096 2>&1 | grep '^run: [0-9]' | sed 's/.*TPOT p50 \([0-9.]* ms\).*decode \([0-9.]*\) tokens.*/TPOT \1 decode \2/'
done; done; done > $OUT/ab.txt 2>&1
for name in $names; do for n in 32 64 128; do cmp -s $OUT/base-$n.txt $OUT/$name-$n.txt || echo "DIFF $name $n"; done; done >> $OUT/ab.txt
for name in $names; do
  echo "=== $name decode 64 kernel times"; env EXP_MOE_NT2=4 ${cfg[$name]} "${run[@]}" -i $R/short-64.txt -o /tmp/o.txt -n 128 --max-batch 64 --step-tokens 4096 --kernel-times 2>&1 | sed -n '/kernels of/,$p' | head -7
done > $OUT/kernel-times.txt 2>&1
cat $OUT/ab.txt $OUT/kernel-times.txt
