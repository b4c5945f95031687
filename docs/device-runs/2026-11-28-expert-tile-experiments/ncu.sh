#!/bin/bash
# Stall reasons of the three kernels that bound the bf16 targets: the warpgroup expert tile at a
# prefill step (mlp1), the 16-pair expert tile at 64 decoding rows (mlp1), the MMA attention at
# batch 1 (decode); one H200, synthetic 20b, main at 532b217.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a"
cmake -S . -B build-device $cfg > /dev/null && cmake --build build-device -j16 --target run parity-synth 2>&1 | grep -E "error:|FAILED:" -A5 | head -20
el built
B=build-device/bin; M=/tmp/parity-models; mkdir -p $M /tmp/req
timeout 60 $B/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out $M/20b > /dev/null
make_requests 64 20 400 /tmp/req/m64.txt; make_requests 16 1600 1700 /tmp/req/long16.txt; head -1 /tmp/req/m64.txt > /tmp/req/m1.txt
run=($B/run $M/20b --backend hip --precision bf16 -m getp --no-progress)
sec=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis)
keep='Duration|Registers|Block Size|Grid Size|Achieved Occ|Theoretical Occ|Warp Cycles Per Issued|Issue Slots Busy|Issued Warp|Eligible Warps|No Eligible|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\)|Waves|Shared Memory|Stall|stall|cycles|One or More|Executed Ipc'
command -v ncu || echo 'no ncu'; el ready
timeout 120 ncu --kernel-name regex:'moe_wgmma' --launch-skip 26 --launch-count 1 "${sec[@]}" --print-details all \
  "${run[@]}" -i /tmp/req/long16.txt -o /tmp/o1.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 > $OUT/ncu-wgmma.txt 2>&1
echo "== warpgroup expert tile, prefill step (mlp1)"; grep -E "$keep" $OUT/ncu-wgmma.txt | head -45
el wgmma
timeout 120 ncu --kernel-name regex:'moe_mma_wide' --launch-skip 400 --launch-count 1 "${sec[@]}" --print-details all \
  "${run[@]}" -i /tmp/req/m64.txt -o /tmp/o2.txt -n 32 --max-batch 64 --step-tokens 2048 --context 4096 > $OUT/ncu-wide.txt 2>&1
echo "== 16-pair expert tile, 64 decoding rows"; grep -E "$keep" $OUT/ncu-wide.txt | head -45
el wide
timeout 120 ncu --kernel-name regex:'attention_mma' --launch-skip 481 --launch-count 1 "${sec[@]}" --print-details all \
  "${run[@]}" -i /tmp/req/m1.txt -o /tmp/o3.txt -n 32 --max-batch 1 --context 4096 > $OUT/ncu-attn.txt 2>&1
echo "== MMA attention, batch 1 decode"; grep -E "$keep" $OUT/ncu-attn.txt | head -45
el end
