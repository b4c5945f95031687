#!/usr/bin/env bash
# The device path's checks on a GPU machine: build, the test suite (device tests included),
# compute-sanitizer, the tiny model traced on the device, the synthetic 20b traced at position
# 0 and past the sliding window, and the decode benchmark against the copy-bandwidth floor.
#
# Usage: scripts/device_check.sh [STEP...]     STEP: build tests sanitize tiny 20b bench (default: all)
# Environment: GPU=cuda|hip (default cuda), BUILD_DIR (build-device), LOG_DIR (device-logs, or
# $OUT when set), MODELS_DIR (where the 20b checkpoint is written; default /tmp/parity-models),
# CUDA_ARCH / HIP_ARCH (90 / gfx90a).
# Every step logs to LOG_DIR/<step>.log and prints a one-line summary; the script stops at the
# first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."

GPU="${GPU:-cuda}"
BUILD_DIR="${BUILD_DIR:-build-device}"
LOG_DIR="${LOG_DIR:-${OUT:-device-logs}}"
MODELS_DIR="${MODELS_DIR:-/tmp/parity-models}"
JOBS="$(nproc)"
mkdir -p "$LOG_DIR"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build tests sanitize tiny 20b bench)
bin="$BUILD_DIR/bin"
tiny_tokens="1,17,300,42,999,5,77,128,256,3,1000,64,9,511,22,700,31,8,123,900"

# Runs "$@" with its output to LOG_DIR/$1.log (appending), echoing the log's tail on failure.
logged() {
  local name="$1"
  shift
  echo "== $(date -u +%FT%TZ) $name: $*" | tee -a "$LOG_DIR/$name.log"
  if ! "$@" >>"$LOG_DIR/$name.log" 2>&1; then
    echo "FAILED: $name ($*); last lines of $LOG_DIR/$name.log:"
    tail -n 60 "$LOG_DIR/$name.log"
    return 1
  fi
}

step_build() {
  local arch_flag=-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}"
  [ "$GPU" = hip ] && arch_flag=-DPARITY_HIP_ARCHITECTURES="${HIP_ARCH:-gfx90a}"
  logged build cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU="$GPU" \
    -DPARITY_WERROR=ON "$arch_flag"
  logged build cmake --build "$BUILD_DIR" -j"$JOBS"
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null ||
      rocm-smi --showproductname 2>/dev/null || true
  } | tee -a "$LOG_DIR/build.log"
}

step_tests() {
  # Two OpenMP threads per test process: ctest runs JOBS of them at once, and spinning OpenMP
  # workers of that many processes oversubscribe the cores (tests of several thread counts
  # set their own).
  OMP_NUM_THREADS=2 logged tests ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 300 -j"$JOBS"
  # The device tests must have run here, not skipped.
  logged tests "$bin/parity_tests" --gtest_filter='DeviceKernels.*:*CandidateTest*hip*:*InjectionTest*hip_*' \
    --gtest_brief=1
  if grep -q "SKIPPED" <("$bin/parity_tests" --gtest_filter='DeviceKernels.*' 2>&1); then
    echo "FAILED: device tests skipped on the GPU machine"
    return 1
  fi
  grep -E "tests passed|tests failed" "$LOG_DIR/tests.log" | tail -n 1
}

step_sanitize() {
  command -v compute-sanitizer >/dev/null || { echo "sanitize: no compute-sanitizer here"; return 0; }
  local cs=(timeout -s KILL 300 compute-sanitizer --error-exitcode 9 --print-limit 20)
  logged sanitize "${cs[@]}" --tool memcheck "$bin/parity_tests" --gtest_filter='DeviceKernels.*' --gtest_brief=1
  logged sanitize "${cs[@]}" --tool racecheck "$bin/parity_tests" --gtest_filter='DeviceKernels.*' --gtest_brief=1
  for tool in memcheck racecheck synccheck initcheck; do
    logged sanitize "${cs[@]}" --tool "$tool" "$bin/parity-trace" --model tiny --models-dir "$MODELS_DIR" \
      --tokens "$tiny_tokens" --candidate hip --out "$LOG_DIR/sanitize-$tool"
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG_DIR/sanitize.log" | sort | uniq -c
  rm -f "$LOG_DIR"/sanitize-*/*.h5
}

step_tiny() {
  logged tiny "$bin/parity-trace" --model tiny --models-dir "$MODELS_DIR" --tokens "$tiny_tokens" \
    --candidate hip --profile fp32 --out "$LOG_DIR/tiny"
  grep -E "^(PASS|DIVERGED)|^candidate|^timing" "$LOG_DIR/tiny.log"
  cp "$LOG_DIR/tiny/report.txt" "$LOG_DIR/tiny-report.txt"
  rm -f "$LOG_DIR"/tiny/*.h5
}

step_20b() {
  if [ ! -f "$MODELS_DIR/20b/config.json" ]; then
    logged 20b "$bin/parity-synth" --preset 20b --out "$MODELS_DIR/20b"
    du -sh "$MODELS_DIR/20b" | tee -a "$LOG_DIR/20b.log"
  fi
  # Position 0, then a position past the sliding window (128) after the documented prefix.
  for pos in 0 130; do
    # exit 1 (diverged) is a result to record, not a script failure
    set +e
    "$bin/parity-trace" --model 20b --models-dir "$MODELS_DIR" --token 0 --pos "$pos" --candidate hip \
      --profile fp32 --out "$LOG_DIR/20b-pos$pos" >>"$LOG_DIR/20b.log" 2>&1
    local rc=$?
    set -e
    echo "20b pos $pos: parity-trace exit $rc" | tee -a "$LOG_DIR/20b.log"
    [ $rc -ge 2 ] && { tail -n 40 "$LOG_DIR/20b.log"; return 1; }
    cp "$LOG_DIR/20b-pos$pos/report.txt" "$LOG_DIR/20b-pos$pos-report.txt"
    cp "$LOG_DIR/20b-pos$pos/report.json" "$LOG_DIR/20b-pos$pos-report.json"
    rm -rf "$LOG_DIR/20b-pos$pos"
  done
  grep -E "^hip backend|^  |^(PASS|DIVERGED)|^timing|^first|exit" "$LOG_DIR/20b.log" | tail -n 40
}

step_bench() {
  [ -f "$MODELS_DIR/20b/config.json" ] || logged bench "$bin/parity-synth" --preset 20b --out "$MODELS_DIR/20b"
  logged bench "$bin/parity-bench" --model 20b --models-dir "$MODELS_DIR" --backend hip --positions 128 \
    --warmup 16 -q
  grep -E "median|floor|bandwidth|work per" "$LOG_DIR/bench.log" | tail -n 4
}

for s in "${steps[@]}"; do
  case "$s" in
    build | tests | sanitize | tiny | 20b | bench) "step_$s" ;;
    *) echo "unknown step $s (build tests sanitize tiny 20b bench)"; exit 2 ;;
  esac
done
