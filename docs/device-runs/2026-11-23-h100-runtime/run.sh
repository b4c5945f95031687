#!/usr/bin/env bash
# Device check of the runtime carve: the new tree (new.tar.gz) and, for the before/after
# comparison in the same run, the tree before it (old.tar.gz). deps/: xxhash and pugixml, which
# the device machine lacks.
set -uo pipefail
R="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-/tmp/out}"
L=/tmp/logs
mkdir -p /tmp/new /tmp/old "$L" "$OUT"
tar -xzf "$R/new.tar.gz" -C /tmp/new
tar -xzf "$R/old.tar.gz" -C /tmp/old
rm -rf /tmp/deps && cp -r "$R/deps" /tmp/deps
(cd /tmp/deps/lib && ln -sf libxxhash.so.0.8.1 libxxhash.so.0 && ln -sf libxxhash.so.0 libxxhash.so &&
  ln -sf libpugixml.so.1.13 libpugixml.so.1 && ln -sf libpugixml.so.1 libpugixml.so &&
  { [ ! -f libpcre2-8.so.0.11.2 ] || { ln -sf libpcre2-8.so.0.11.2 libpcre2-8.so.0 && ln -sf libpcre2-8.so.0 libpcre2-8.so; }; })
export CMAKE_PREFIX_PATH=/tmp/deps PKG_CONFIG_PATH=/tmp/deps/lib/pkgconfig LD_LIBRARY_PATH=/tmp/deps/lib
export MODELS_DIR=/tmp/parity-models
S="$OUT/summary.txt"
say() { echo "$*" | tee -a "$S"; }
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
finish() { tar -czf "$OUT/logs.tgz" -C /tmp logs 2>/dev/null; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee -a "$S"
build() {  # $1 tree, $2 log, $3 -j, targets...
  local tree=$1 log=$2 j=$3; shift 3
  (cd "$tree" && for werror in ON OFF; do
     cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=$werror \
       -DCMAKE_CUDA_ARCHITECTURES=90 >>"$log" 2>&1 && cmake --build build -j"$j" "$@" >>"$log" 2>&1 &&
       { echo "built with PARITY_WERROR=$werror"; exit 0; }
     echo "build with PARITY_WERROR=$werror FAILED: $(grep -m3 -E 'error|FAILED' "$log" | head -c 600)"
   done; exit 1)
}
say "new: $(build /tmp/new "$L/build.log" 16)"
say "[$(el) s] new build done"
cd /tmp/new
build /tmp/old "$L/old-build.log" 6 --target parity-trace parity-bench >"$L/old-build.txt" 2>&1 &
oldpid=$!
OMP_NUM_THREADS=2 timeout 200 ctest --test-dir build --output-on-failure --timeout 150 -j16 >"$L/tests.log" 2>&1
say "ctest exit $?: $(grep -E 'tests passed|tests failed' "$L/tests.log" | tail -n 1)"
grep -A25 "The following tests FAILED" "$L/tests.log" | tee -a "$S"
say "ctest skipped: $(grep -c '(Skipped)' "$L/tests.log")"
timeout 100 build/bin/parity_tests --gtest_filter='DeviceKernels.*:DeviceRuntimeTest.*' >"$L/device-tests.log" 2>&1
say "device kernel + runtime tests: exit $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests from .* ran' "$L/device-tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure$|Skipped$" "$L/device-tests.log" | head -n 20 | tee -a "$S"
say "[$(el) s] tests done"
wait $oldpid; say "old: $(tail -n 1 "$L/old-build.txt")"
N=/tmp/new/build/bin O=/tmp/old/build/bin
cmp_h5() {
  timeout 60 python3 - "$1" "$2" "$3" <<'PY' 2>&1 | tail -n 3 | tee -a "$S"
import sys, h5py
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
def names(f):
    n = []
    f.visititems(lambda k, o: n.append(k) if isinstance(o, h5py.Dataset) else None)
    return n
na, nb = names(a), names(b)
diff = [k for k in na if k in b and (a[k].shape != b[k].shape or a[k][()].tobytes() != b[k][()].tobytes())]
print(f"{sys.argv[3]}: old {len(na)} datasets, new {len(nb)}, unpaired {len(set(na) ^ set(nb))}, bitwise different {len(diff)} {diff[:5]}")
PY
}
verdict() { grep -E '^(PASS|DIVERGED)' "$1" 2>/dev/null | head -n 1 | head -c 260; }
tok="1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900"
for v in new old; do
  B=$([ $v = old ] && echo $O || echo $N)
  timeout 60 $B/parity-trace --model tiny --models-dir $MODELS_DIR --tokens $tok --generate 8 --candidate hip --out /tmp/tiny-$v >"$L/tiny-$v.log" 2>&1
  say "tiny $v: exit $? $(verdict /tmp/tiny-$v/report.txt)"
done
grep -E "^candidate|^timing|^generated" /tmp/tiny-new/report.txt | head -n 4 | tee -a "$S"
cmp_h5 /tmp/tiny-old/candidate.h5 /tmp/tiny-new/candidate.h5 "tiny candidate.h5 (20 tokens + 8 generated, replay)"
timeout 60 $N/parity-trace --model tiny --models-dir $MODELS_DIR --token 5 --pos 4000 --candidate hip --out /tmp/tiny-4000 >"$L/tiny-4000.log" 2>&1
say "tiny pos 4000 new: exit $? $(verdict /tmp/tiny-4000/report.txt)"
cp /tmp/tiny-new/report.txt "$L/tiny-report.txt"
say "[$(el) s] tiny done"
[ -f $MODELS_DIR/20b/config.json ] || timeout 60 $N/parity-synth --preset 20b --out $MODELS_DIR/20b >"$L/synth.log" 2>&1
say "[$(el) s] 20b synthesized: $(head -n 1 "$L/synth.log" | head -c 160)"
for i in 1 2; do for v in old new; do
  B=$([ $v = old ] && echo $O || echo $N)
  timeout 60 $B/parity-bench --model 20b --models-dir $MODELS_DIR --backend hip --positions 128 --warmup 16 -q >"$L/bench-$v-$i.log" 2>&1
  say "bench $v $i: $(grep -E '^median' "$L/bench-$v-$i.log" | head -c 170)"
done; done
grep -E "floor|bandwidth" "$L/bench-new-2.log" | tee -a "$S"
grep -A5 "device runtime on" "$L/bench-new-2.log" | tee -a "$S"
say "[$(el) s] bench done"
trace20() {  # $1 old|new, $2 position
  local B=$([ $1 = old ] && echo $O || echo $N)
  timeout 120 $B/parity-trace --model $MODELS_DIR/20b --token 0 --pos $2 --candidate hip --step 256 --out /tmp/20b-$1-$2 >"$L/20b-$1-$2.log" 2>&1
  say "20b pos $2 $1: exit $? $(verdict /tmp/20b-$1-$2/report.txt)"
  grep -E "^timing" /tmp/20b-$1-$2/report.txt | head -n 1 | tee -a "$S"
  cp /tmp/20b-$1-$2/report.txt "$L/20b-$1-pos$2-report.txt" 2>/dev/null
}
trace20 new 0
trace20 new 200
trace20 old 200
cmp_h5 /tmp/20b-old-200/candidate.h5 /tmp/20b-new-200/candidate.h5 "20b candidate.h5 pos 200 (replay)"
say "[$(el) s] 20b traces done"
if command -v compute-sanitizer >/dev/null; then
  timeout 45 compute-sanitizer --error-exitcode 9 --print-limit 20 --tool memcheck build/bin/parity_tests \
    --gtest_filter='DeviceKernels.Attention*:DeviceRuntimeTest.StepUploads*:DeviceRuntimeTest.ASequence*' --gtest_brief=1 >"$L/memcheck-tests.log" 2>&1
  say "memcheck attention kernel + runtime tests: exit $? $(grep -E 'ERROR SUMMARY' "$L/memcheck-tests.log" | tail -n 1)"
fi
if [ "$(el)" -lt 300 ]; then trace20 new 1000; fi
if [ "$(el)" -lt 330 ] && command -v compute-sanitizer >/dev/null; then
  timeout $(( 385 - $(el) )) compute-sanitizer --error-exitcode 9 --print-limit 20 --tool memcheck $N/parity-trace --model tiny --models-dir $MODELS_DIR \
    --tokens $tok --candidate hip --out /tmp/tiny-memcheck >"$L/memcheck-tiny.log" 2>&1
  say "memcheck tiny trace (replay): exit $? $(grep -E 'ERROR SUMMARY' "$L/memcheck-tiny.log" | tail -n 1)"
fi
say "[$(el) s] all done"
