#!/usr/bin/env bash
# Device verification and benchmarks of a change that must keep every result bit for bit: the
# new tree (/tmp/src) and the tree before it (/tmp/old), built side by side from git archives in
# build-devdeps/ (src.tar.gz, old.tar.gz; NO_OLD=1 skips the old tree), and an experiment tree
# (/tmp/alt) where build-devdeps/alt.tar.gz exists.
# Steps: build tests ctest sanitize bitwise bench quick ncu prof kt prefill batched graphs stalls
#        sass ab ktests
# A warm machine keeps /tmp/src and /tmp/old from its last call: remove them to take new archives.
#   bitwise: the 20b traced at positions 200 and 700 (replay on) and the tiny model, by both
#            trees; every dataset of the candidate traces compared bit for bit (h5py), and the
#            engine's greedy tokens at 64 requests compared.
set -uo pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
M=/tmp/parity-models
export LOG_DIR=$OUT GPU=cuda
setup() {
  for t in src old alt; do
    [ -d /tmp/$t ] && continue
    [ -f $R/build-devdeps/$t.tar.gz ] || continue
    [ "$t" = old ] && [ "${NO_OLD:-0}" = 1 ] && continue
    mkdir -p /tmp/$t && tar -xzf $R/build-devdeps/$t.tar.gz -C /tmp/$t && cp -r $R/build-devdeps /tmp/$t/
  done
}
synth20b() {
  [ -f $M/20b/config.json ] || /tmp/src/build-device/bin/parity-synth --preset 20b --tokenizer /tmp/src/build-devdeps/o200k_harmony/tokenizer.json --out $M/20b >/dev/null
}
step_build() {
  local t0=$SECONDS
  (cd /tmp/src && bash scripts/device_check.sh build >/dev/null && echo "new built") || { tail -30 $OUT/build.log; return 1; }
  if [ "${NO_OLD:-0}" != 1 ]; then
    # The old tree needs only the tools (its environment as device_check.sh sets it up).
    (cd /tmp/old && mkdir -p $OUT/old && sed -i 's/logged build cmake --build "$BUILD_DIR" -j"$JOBS"$/logged build cmake --build "$BUILD_DIR" -j"$JOBS" --target parity-trace parity-bench run/' scripts/device_check.sh &&
      LOG_DIR=$OUT/old bash scripts/device_check.sh build >/dev/null && echo "old built") || tail -30 $OUT/old/build.log
  fi
  if [ -d /tmp/alt ]; then
    (cd /tmp/alt && mkdir -p $OUT/alt && sed -i 's/logged build cmake --build "$BUILD_DIR" -j"$JOBS"$/logged build cmake --build "$BUILD_DIR" -j"$JOBS" --target parity-trace parity-bench run parity_tests/' scripts/device_check.sh &&
      LOG_DIR=$OUT/alt bash scripts/device_check.sh build >/dev/null && echo "alt built") || tail -30 $OUT/alt/build.log
  fi
  echo "build took $((SECONDS - t0)) s"
}
step_tests() {
  cd /tmp/src
  build-device/bin/parity_tests --gtest_filter='DeviceKernels.*:DeviceRuntime*:Device*:*CandidateTest*hip*:*InjectionTest*hip_*:*Mutation*hip*' --gtest_brief=1 2>&1 | tail -4
  bash scripts/device_check.sh engine 2>&1 | tail -4
}
step_engine() {  # the engine's device tests alone
  cd /tmp/src && bash scripts/device_check.sh engine 2>&1 | tail -4
}
step_ctest() {
  cd /tmp/src
  OMP_NUM_THREADS=2 ctest --test-dir build-device -j8 --timeout 300 2>&1 | grep -E "tests passed|\(Failed\)|Timeout"
}
step_sanitize() {
  cd /tmp/src
  local cs=(timeout -s KILL 200 compute-sanitizer --error-exitcode 9 --print-limit 10)
  "${cs[@]}" --tool memcheck build-device/bin/parity_tests --gtest_filter='DeviceKernels.Moe*:DeviceKernels.Mxfp4*:DeviceKernels.Attention*' --gtest_brief=1 2>&1 | tail -2
  "${cs[@]}" --tool racecheck build-device/bin/parity_tests --gtest_filter='DeviceKernels.Attention*' --gtest_brief=1 2>&1 | tail -2
  # The wide tiles' shared-memory staging (experts and projections).
  "${cs[@]}" --tool racecheck build-device/bin/parity_tests --gtest_filter='DeviceKernels.MoeTilingsAgreeOddShapes:DeviceKernels.GemvMmaBatchPastOneTileAndThreeSegments:DeviceKernels.MoeMmaPathsAgainstTheReference' --gtest_brief=1 2>&1 | tail -2
  "${cs[@]}" --tool memcheck build-device/bin/parity_tests --gtest_filter='DeviceKernels.Gemv*' --gtest_brief=1 2>&1 | tail -2
  "${cs[@]}" --tool initcheck build-device/bin/parity_tests --gtest_filter='DeviceKernels.Mxfp4*:DeviceKernels.MoeTilingsAgreeOdd*:DeviceKernels.Attention*' --gtest_brief=1 2>&1 | tail -2
  # The step graphs: captured and replayed steps under memcheck and initcheck.
  "${cs[@]}" --tool memcheck build-device/bin/parity_tests --gtest_filter='DeviceRuntimeTest.*Graph*:DeviceRuntimeTest.AStepShape*' --gtest_brief=1 2>&1 | tail -2
  "${cs[@]}" --tool initcheck build-device/bin/parity_tests --gtest_filter='DeviceRuntimeTest.AStepShape*' --gtest_brief=1 2>&1 | tail -2
}
trace_both() {  # trace_both LABEL ARGS...: traces with both trees, compares the candidates
  local label=$1; shift
  for t in old src; do
    rm -rf /tmp/tr-$t-$label
    (cd /tmp/$t && build-device/bin/parity-trace "$@" --candidate hip --out /tmp/tr-$t-$label > /tmp/tr-$t-$label.log 2>&1)
    echo "$t $label exit $?: $(grep -E '^(PASS|DIVERGED)' /tmp/tr-$t-$label/report.txt | cut -c1-160)"
  done
  python3 - /tmp/tr-old-$label/candidate.h5 /tmp/tr-src-$label/candidate.h5 "$label" <<'PY'
import sys, h5py, numpy as np
a, b, label = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), sys.argv[3]
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
nb = []
b.visititems(lambda n, o: nb.append(n) if isinstance(o, h5py.Dataset) else None)
diff = [n for n in names if n not in b or a[n].shape != b[n].shape or
        a[n][()].tobytes() != b[n][()].tobytes()]
print(f"{label}: {len(names)} datasets (new tree {len(nb)}), {len(diff)} differ in any bit", diff[:5])
PY
  cp /tmp/tr-src-$label/report.txt $OUT/$label-report.txt 2>/dev/null
}
step_bitwise() {
  synth20b
  trace_both tiny --model tiny --models-dir $M --tokens 1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900 --generate 8
  trace_both 20b-pos200 --model $M/20b --token 0 --pos 200 --step 256
  trace_both 20b-pos700 --model $M/20b --token 0 --pos 700 --step 256
}
bench_one() {  # bench_one TREE LABEL ARGS...
  local tree=$1 label=$2; shift 2
  echo "$label: $(/tmp/$tree/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/o-$tree.txt "$@" 2>&1 | grep '^run: [0-9]')"
}
requests() {
  source <(sed -n '/^make_requests() {/,/^}/p' /tmp/src/scripts/device_check.sh)
  make_requests 64 20 400 /tmp/mixed-64.txt; make_requests 16 1600 1700 /tmp/long-16.txt; make_requests 1 60 60 /tmp/one.txt
}
step_bench() {
  synth20b; requests
  for tree in old src; do
    for i in 1 2; do echo "$tree parity-bench b1: $(/tmp/$tree/build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"; done
    bench_one $tree "$tree N=1" -i /tmp/one.txt -n 128 --max-batch 1
    bench_one $tree "$tree N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048; cp /tmp/o-$tree.txt /tmp/o64-$tree.txt
    bench_one $tree "$tree prefill" -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096
  done
  cmp /tmp/o64-old.txt /tmp/o64-src.txt && echo "N=64 greedy outputs identical old/new" || echo "N=64 outputs DIFFER old/new"
  for tree in old src; do
    echo "== $tree kernel times at batch 1"
    /tmp/$tree/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/k1.txt -i /tmp/one.txt -n 64 --max-batch 1 --kernel-times 2>&1 | sed -n '/kernel times/,/^all/p' | head -20
  done
}
step_quick() {  # the new tree alone
  synth20b; requests
  for i in 1 2; do echo "src parity-bench b1: $(/tmp/src/build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"; done
  bench_one src "src N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048
  /tmp/src/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/k1.txt -i /tmp/one.txt -n 64 --max-batch 1 --kernel-times 2>&1 | sed -n '/kernel times/,/^all/p' | head -20
}
step_ncu() {  # batch-1 profile of the expert, dense and attention kernels (clocks as found)
  cd /tmp/src; synth20b
  command -v ncu >/dev/null || { echo "no ncu"; return 0; }
  timeout 200 ncu --clock-control none --kernel-name regex:"moe_mma|bf16w_mma|pv_gqa|scores_gqa" --launch-skip 60 --launch-count 8 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
    build-device/bin/parity-bench --model $M/20b --backend hip --positions 2 --warmup 1 -q > $OUT/ncu.txt 2>&1
  grep -E "moe_mma|bf16w_mma|pv_gqa|scores_gqa|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible" $OUT/ncu.txt | head -60
}
step_prof() {  # every kernel's device time at batch 1 (ncu, clocks as found), grouped per token
  cd /tmp/src; synth20b; requests
  command -v ncu >/dev/null || { echo "no ncu"; return 0; }
  local tree=${PROF_TREE:-src}
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    /tmp/$tree/build-device/bin/parity-bench --model $M/20b --backend hip ${PROF_ARGS:---positions 4 --warmup 0} -q > /tmp/prof-$tree.csv 2>/tmp/prof-$tree.err
  cp /tmp/prof-$tree.csv $OUT/prof-$tree.csv 2>/dev/null
  python3 - /tmp/prof-$tree.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}
for r in rows:
    name = r[ki].split("(")[0].split("<")[0].replace("void ", "").replace("parity::device::", "").replace("(anonymous namespace)::", "")
    tot[name] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1.0); cnt[name] += 1
T = sum(tot.values())
print(f"{len(rows)} kernels, {T/1e3:.3f} ms in all")
for n, t in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"  {n[:60]:60s} {cnt[n]:6d} {t:10.1f} us {t/cnt[n]:8.2f} us/call {100*t/T:5.1f}%")
PY
}
step_kt() {  # kernel times at 64 requests (decode-heavy) and at prefill
  cd /tmp/src; synth20b; requests
  echo "== N=64 kernel times"
  build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/k64.txt -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048 --kernel-times 2>&1 | grep -E "^run: [0-9]|kernel times" -A22 | head -26
  echo "== prefill kernel times"
  build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/kp.txt -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 --kernel-times 2>&1 | grep -E "^run: [0-9]|kernel times" -A22 | head -26
}

step_prefill() {  # the new tree alone: prefill and 64 requests twice, batch 1, prefill kernel times
  synth20b; requests
  for i in 1 2; do
    bench_one src "src prefill" -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096
    bench_one src "src N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048
    echo "src parity-bench b1: $(/tmp/src/build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"
  done
  /tmp/src/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/kp.txt -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 --kernel-times 2>&1 | grep -E "^(mlp1|mlp2|attn_out|o_proj|all) "
}

step_batched() {  # batched decode (parity-bench --batch): aggregate tokens/s, bytes per step, floor
  synth20b
  for tree in ${BATCH_TREES:-old src}; do
    for B in ${BATCHES:-8 32 64 128 256}; do
      echo "$tree $(/tmp/$tree/build-device/bin/parity-bench --model $M/20b --backend hip --batch $B --start ${BATCH_START:-256} --positions 16 --warmup 2 -q 2>&1 | grep -E '^(batch|bytes|device)' | tr '\n' ' ')"
    done
  done
}

step_ncub64() {  # the expert and dense kernels at batch 64 in detail (clocks as found)
  cd /tmp/${PROF_TREE:-src}; synth20b
  timeout 300 ncu --clock-control none --kernel-name regex:"moe_mma|bf16w_mma|pv_gqa|scores_gqa" --launch-skip 40 --launch-count 8 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section LaunchStats \
    build-device/bin/parity-bench --model $M/20b --backend hip --batch 64 --positions 2 -q > $OUT/ncu-b64.txt 2>&1
  grep -E "moe_mma|bf16w_mma|pv_gqa|scores_gqa|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Issue Slots Busy|No Eligible|L2 Hit" $OUT/ncu-b64.txt | head -90
}

step_dram() {  # DRAM bytes the expert and dense kernels read per batch-64 step (ncu, caches flushed per kernel)
  cd /tmp/src; synth20b
  command -v ncu >/dev/null || { echo "no ncu"; return 0; }
  timeout 200 ncu --clock-control none --metrics dram__bytes_read.sum,gpu__time_duration.sum --kernel-name regex:"moe_mma|bf16w_mma" --csv \
    build-device/bin/parity-bench --model $M/20b --backend hip --batch 64 --positions 2 -q > /tmp/dram.csv 2>/tmp/dram.err
  cp /tmp/dram.csv $OUT/dram-b64.csv
  python3 - /tmp/dram.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, mi, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}
for r in rows:
    name = r[ki].split("(")[0].replace("void ", "").replace("(anonymous namespace)::", "")[:50]
    tot[(name, r[mi])] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1.0)
    if r[mi].startswith("dram"): cnt[name] += 1
steps = 3  # two timed steps and the census step
for (n, m), v in sorted(tot.items()):
    print(f"  {n:50s} {m:24s} per step {v/steps/1e9 if m.startswith('dram') else v/steps/1e3:10.3f} {'GB' if m.startswith('dram') else 'ms'} ({cnt[n]//steps} launches per step)")
PY
}

step_final() {  # the slice's figures: batched decode, batch 1, prefill and 64 requests (old vs new where it can move)
  synth20b; requests
  for B in 8 32 64 128 256; do
    echo "src $(/tmp/src/build-device/bin/parity-bench --model $M/20b --backend hip --batch $B --start 256 --positions 16 --warmup 2 -q 2>&1 | grep -E '^(batch|bytes|device)' | tr '\n' ' ')"
  done
  echo "old $(/tmp/old/build-device/bin/parity-bench --model $M/20b --backend hip --batch 256 --start 256 --positions 16 --warmup 2 -q 2>&1 | grep -E '^batch')"
  for tree in old src; do
    bench_one $tree "$tree prefill" -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096
    bench_one $tree "$tree N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048; cp /tmp/o-$tree.txt /tmp/o64-$tree.txt
  done
  cmp /tmp/o64-old.txt /tmp/o64-src.txt && echo "N=64 greedy outputs identical old/new" || echo "N=64 outputs DIFFER old/new"
  echo "src parity-bench b1: $(/tmp/src/build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"
}

step_graphs() {  # the new tree with its step graphs on and off, in one call
  synth20b; requests
  local b=/tmp/src/build-device/bin
  for i in 1 2; do
    for g in 0 1; do
      echo "graphs=$g parity-bench b1: $(PARITY_DEVICE_GRAPHS=$g $b/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"
    done
  done
  for B in 8 64; do
    for g in 0 1; do
      echo "graphs=$g $(PARITY_DEVICE_GRAPHS=$g $b/parity-bench --model $M/20b --backend hip --batch $B --start 256 --positions 16 --warmup 2 -q 2>&1 | grep -E '^batch')"
    done
  done
  for flag in --no-graphs --graphs; do
    local f=$flag; [ "$flag" = --graphs ] && f=
    for job in "N=1:-i /tmp/one.txt -n 128 --max-batch 1" "N=64:-i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048"; do
      echo "$flag ${job%%:*}: $($b/run $M/20b --backend hip -m getp --no-progress -o /tmp/g${flag}-${job%%:*}.txt ${job#*:} $f 2>&1 | grep -E '^run: [0-9]|replayed' | tr '\n' ' ')"
    done
  done
  cmp /tmp/g--no-graphs-N=64.txt /tmp/g--graphs-N=64.txt && echo "N=64 greedy outputs identical with and without graphs" || echo "N=64 outputs DIFFER with and without graphs"
  cmp /tmp/g--no-graphs-N=1.txt /tmp/g--graphs-N=1.txt && echo "N=1 outputs identical with and without graphs" || echo "N=1 outputs DIFFER"
}

step_knobs() {  # experiment knobs of an experiment build (PARITY_X_*), each against the default
  synth20b
  local b=/tmp/src/build-device/bin
  for v in "" PARITY_X_DENSE=deep PARITY_X_MOE_MT4=1 PARITY_X_DENSE=42 PARITY_X_DENSE=14; do
    echo "[$v] $(env $v $b/parity_tests --gtest_filter='DeviceKernels.Gemv*:DeviceKernels.Moe*:DeviceKernels.Mxfp4*' --gtest_brief=1 2>&1 | tail -1)"
  done
  for i in 1 2; do
    for v in "" PARITY_X_DENSE=deep; do
      echo "[$v] b1: $(env $v $b/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1 | grep -oE 'measured .*')"
    done
  done
  for B in ${BATCHES:-8 32 64 128}; do
    for v in "" PARITY_X_MOE_MT4=1 PARITY_X_DENSE=42 PARITY_X_DENSE=14; do
      echo "[$v] $(env $v $b/parity-bench --model $M/20b --backend hip --batch $B --start 256 --positions 16 --warmup 2 -q 2>&1 | grep -E '^batch' | cut -c1-60)"
    done
  done
}

step_deep() {  # experiment: a deeper ring (3 chunks, 2 blocks per SM) for small-batch launches of few row tiles
  synth20b
  local b=/tmp/src/build-device/bin
  echo "[PARITY_X_DEEP_MAX=264] $(PARITY_X_DEEP_MAX=264 $b/parity_tests --gtest_filter='DeviceKernels.Gemv*' --gtest_brief=1 2>&1 | tail -1)"
  for i in 1 2 3; do
    for v in "" PARITY_X_DEEP_MAX=264; do
      echo "[$v] b1: $(env $v $b/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1 | grep -oE 'measured .*')"
    done
  done
}

step_argmax() {  # the argmax kernel: old and new trees at batch 1, and its device time under ncu
  synth20b
  for i in 1 2 3; do
    for tree in old src; do
      echo "$tree b1: $(/tmp/$tree/build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1 | grep -oE 'measured .*')"
    done
  done
  for tree in old src; do
    echo "$tree argmax (ncu, us): $(cd /tmp/$tree && timeout 120 ncu --clock-control none --kernel-name regex:f32_argmax --metrics gpu__time_duration.sum --csv build-device/bin/parity-bench --model $M/20b --backend hip --positions 4 --warmup 0 -q 2>/dev/null | grep f32_argmax | awk -F'","' '{print $NF}' | tr -d '"' | tr '\n' ' ')"
  done
}

step_stalls() {  # why the batch-1 expert and dense kernels wait: stall reasons per issued instruction (ncu)
  cd /tmp/${PROF_TREE:-src}; synth20b; requests
  command -v ncu >/dev/null || { echo "no ncu"; return 0; }
  # STALL_PREFILL=1: the prefill of 16 long prompts (`run`) instead of parity-bench.
  local cmd=(build-device/bin/parity-bench --model $M/20b --backend hip ${STALL_ARGS:---positions 2 --warmup 1} -q)
  [ "${STALL_PREFILL:-0}" = 1 ] && cmd=(build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/ks.txt -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 --kv-memory 4G)
  timeout 400 ncu --clock-control none --kernel-name regex:"${STALL_KERNELS:-moe_mma|bf16w_mma}" --launch-skip ${STALL_SKIP:-40} --launch-count ${STALL_COUNT:-6} --csv \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,launch__grid_size,smsp__warps_issue_stalled_long_scoreboard_per_warp_active.pct,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum \
    "${cmd[@]}" > /tmp/stalls.csv 2>/tmp/stalls.err
  cp /tmp/stalls.csv $OUT/stalls-${PROF_TREE:-src}.csv
  python3 - /tmp/stalls.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ii, ki, mi, vi = hdr.index("ID"), hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value")
by = collections.OrderedDict()
for r in rows:
    by.setdefault((r[ii], r[ki].split("(")[0].replace("void ", "").replace("parity::device::", "").replace("(anonymous namespace)::", "")[:70]), {})[r[mi]] = r[vi]
for (i, k), m in by.items():
    st = {n.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""): float(v.replace(",", "")) for n, v in m.items() if n.startswith("smsp__average_warps_issue_stalled_")}
    top = sorted(st.items(), key=lambda x: -x[1])[:7]
    print(f"{i} {k}")
    print("   " + " ".join(f"{n}={m.get(n, '?')}" for n in ["gpu__time_duration.sum", "launch__grid_size", "launch__registers_per_thread", "sm__inst_executed.sum", "dram__bytes_read.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "lts__t_bytes.sum"]))
    print("   stalls per issue: " + " ".join(f"{n}={v:.2f}" for n, v in top))
PY
  tail -3 /tmp/stalls.err
}

step_sass() {  # per-instruction stall samples of one expert launch at batch 1, and the kernels' SASS
  cd /tmp/${PROF_TREE:-src}; synth20b
  timeout 200 ncu --clock-control none --kernel-name regex:"${SASS_KERNEL:-moe_mma}" --launch-skip ${SASS_SKIP:-40} --launch-count 1 \
    --section WarpStateStats --section SourceCounters --page source --csv --print-source sass \
    build-device/bin/parity-bench --model $M/20b --backend hip ${STALL_ARGS:---positions 2 --warmup 1} -q > $OUT/source-${SASS_KERNEL:-moe_mma}.csv 2>/tmp/sass.err
  tail -2 /tmp/sass.err; wc -l $OUT/source-*.csv
  local o=$(find build-device -name "experts.hip.o" | head -1)
  command -v cuobjdump >/dev/null && cuobjdump -sass $o > $OUT/experts.sass 2>&1 || /usr/local/cuda/bin/cuobjdump -sass $o > $OUT/experts.sass 2>&1; ls -la $OUT/experts.sass
}

step_ab() {  # trees side by side (TREES, default old src alt): batch 1 alternating, batched, expert kernel times under ncu
  synth20b
  local trees=${TREES:-old src alt}
  for i in 1 2; do
    for tree in $trees; do [ -d /tmp/$tree ] || continue
      echo "$tree b1: $(/tmp/$tree/build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1 | grep -oE 'measured .*')"
    done
  done
  for B in ${AB_BATCHES:-8 64}; do
    for tree in $trees; do [ -d /tmp/$tree ] || continue
      echo "$tree $(/tmp/$tree/build-device/bin/parity-bench --model $M/20b --backend hip --batch $B --start 256 --positions 16 --warmup 2 -q 2>&1 | grep -E '^batch' | cut -c1-70)"
    done
  done
  if [ "${AB_PREFILL:-0}" = 1 ]; then
    requests
    for tree in $trees; do [ -d /tmp/$tree ] || continue
      bench_one $tree "$tree prefill" -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096
      bench_one $tree "$tree N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048; cp /tmp/o-$tree.txt /tmp/o64-$tree.txt
    done
    cmp /tmp/o64-old.txt /tmp/o64-src.txt && echo "N=64 greedy outputs identical old/src" || echo "N=64 outputs DIFFER old/src"
  fi
  [ "${AB_NCU:-1}" = 1 ] || return 0
  for tree in $trees; do [ -d /tmp/$tree ] || continue
    (cd /tmp/$tree && timeout 120 ncu --clock-control none --kernel-name regex:"${AB_KERNELS:-moe_mma}" --metrics gpu__time_duration.sum,launch__registers_per_thread --csv build-device/bin/parity-bench --model $M/20b --backend hip ${AB_NCU_ARGS:---positions 3 --warmup 0} -q 2>/dev/null > /tmp/ab-$tree.csv)
    python3 - /tmp/ab-$tree.csv $tree <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, mi, vi = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value")
t = collections.defaultdict(list); regs = {}
for r in rows:
    k = r[ki].split("(")[0].split("<", 1)[-1][:24]
    if r[mi].startswith("gpu__time"): t[k].append(float(r[vi].replace(",", "")) / 1e3)
    else: regs[k] = r[vi]
print(sys.argv[2], " ".join(f"<{k}: {len(v)} launches, median {sorted(v)[len(v)//2]:.2f} us, sum/3 steps {sum(v)/3:.1f} us, {regs.get(k)} regs" for k, v in t.items()))
PY
  done
}

step_ktests() {  # the projection, expert and runtime tests of every tree built (src, alt)
  for tree in src alt; do [ -d /tmp/$tree/build-device ] || continue
    echo "$tree: $(/tmp/$tree/build-device/bin/parity_tests --gtest_filter='DeviceKernels.Gemv*:DeviceKernels.Moe*:DeviceKernels.Mxfp4*:DeviceRuntime*' --gtest_brief=1 2>&1 | tail -3 | tr '\n' ' ')"
  done
}

step_kpre() {  # prefill kernel times of both trees (16 prompts of about 1,650 tokens)
  synth20b; requests
  for tree in ${KPRE_TREES:-old src}; do
    echo "== $tree prefill kernel times"
    /tmp/$tree/build-device/bin/run $M/20b --backend hip -m getp --no-progress -o /tmp/kp-$tree.txt -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096 --kernel-times 2>&1 | grep -E "^run: [0-9]|^(mlp1|mlp2|scores|attn_out|att|o_proj|qkv|all) "
  done
  cmp /tmp/kp-old.txt /tmp/kp-src.txt && echo "prefill outputs identical old/src" || echo "prefill outputs DIFFER old/src"
}

step_atests() {  # the attention and runtime tests of the new tree
  cd /tmp/src
  build-device/bin/parity_tests --gtest_filter='DeviceKernels.Attention*:DeviceRuntime*:StepLayout*' --gtest_brief=1 2>&1 | tail -4
}

step_alttrace() {  # the experiment tree's candidate traces (20b at 200 and 700, tiny): verdict and largest shares
  synth20b
  for job in "tiny:--model tiny --models-dir $M --tokens 1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900 --generate 8" "20b-pos200:--model $M/20b --token 0 --pos 200 --step 256" "20b-pos700:--model $M/20b --token 0 --pos 700 --step 256"; do
    rm -rf /tmp/tr-alt-${job%%:*}
    (cd /tmp/src && build-device/bin/parity-trace ${job#*:} --candidate hip --out /tmp/tr-alt-${job%%:*} > /tmp/tr-alt.log 2>&1)
    echo "alt ${job%%:*} exit $?: $(grep -E '^(PASS|DIVERGED)' /tmp/tr-alt-${job%%:*}/report.txt | cut -c1-400)"
    cp /tmp/tr-alt-${job%%:*}/report.txt $OUT/alt-${job%%:*}-report.txt 2>/dev/null
  done
}

step_wsan() {  # compute-sanitizer over the wide tiles' tests (memcheck, racecheck, initcheck)
  cd /tmp/src
  local cs=(timeout -s KILL 120 compute-sanitizer --error-exitcode 9 --print-limit 10)
  local f='DeviceKernels.MoeTilingsAgreeOddShapes:DeviceKernels.GemvWideAndQuarterTilesAgree:DeviceKernels.MoeTilingsAgreeMlp2RealShape:DeviceKernels.GemvMmaBatchPastOneTileAndThreeSegments:DeviceKernels.MoeMmaPathsAgainstTheReference:DeviceKernels.MoeTilingsAgreeOverEveryScale'
  for tool in memcheck racecheck initcheck; do
    echo "$tool: $("${cs[@]}" --tool $tool build-device/bin/parity_tests --gtest_filter="$f" --gtest_brief=1 2>&1 | tail -2 | tr '\n' ' ')"
  done
}
step_figs() {  # the new tree's figures: batched decode, batch 1, prefill, 64 requests
  synth20b; requests
  for B in 8 32 64 128 256; do
    echo "src $(/tmp/src/build-device/bin/parity-bench --model $M/20b --backend hip --batch $B --start 256 --positions 16 --warmup 2 -q 2>&1 | grep -E '^(batch|bytes|device)' | tr '\n' ' ')"
  done
  for i in 1 2; do echo "src parity-bench b1: $(/tmp/src/build-device/bin/parity-bench --model $M/20b --backend hip --positions 128 --warmup 16 -q 2>&1 | tail -1)"; done
  bench_one src "src prefill" -i /tmp/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096
  bench_one src "src N=64" -i /tmp/mixed-64.txt -n 64 --max-batch 64 --step-tokens 2048
}

setup
for s in "$@"; do echo "== $s $(date -u +%T)"; "step_$s"; done
