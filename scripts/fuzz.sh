#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cpp; clang, ASan+UBSan) into build-fuzz/ and runs
# each for a bounded time on a copy of its seed corpus (fuzz/corpus/<target>/ is never written).
# A crash, sanitizer report, leak, timeout (>10 s on one input) or out-of-memory (>2048 MB) is
# a finding: its input is saved as fuzz-findings/<target>/<kind>-<sha1>, and the script fails
# with a line naming the target and the file. So is memory that grows over a run (see below).
# Reproduce: <build>/bin/<target> fuzz-findings/<target>/<kind>-<sha1>
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET [BUILD_DIR]]   (default 60)
#   BUILD_DIR: run the targets another build made instead of building build-fuzz/: the sanitized
#   tree of `scripts/sanitize.sh -DPARITY_FUZZ_IN_TREE=ON` (CI's short run; its libraries carry
#   the light coverage instrumentation only, cmake/fuzz.cmake says which).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
seconds="${1:-60}"
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] ||
  { echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET [BUILD_DIR]]"; exit 2; }
build="$root/build-fuzz"
prebuilt=""
if [ -n "${2:-}" ]; then
  [ -d "$2/bin" ] || { echo "fuzz: $2 holds no bin/ of built targets"; exit 2; }
  build="$(cd "$2" && pwd)"
  prebuilt=1
fi
findings="$root/fuzz-findings"

# libFuzzer is clang's: clang (Debian 12: clang 14), its runtimes (libclang-rt-14-dev holds
# libclang_rt.fuzzer and the sanitizer runtimes; apt only recommends it, and CI installs without
# recommends) and clang's OpenMP runtime (libomp-14-dev: model/ links OpenMP). The project's
# own packages are scripts/setup.sh's list, read from there, the one place they are kept.
packages=()
eval "$(sed -n '/^packages=(/,/)/p' scripts/setup.sh)"
[ ${#packages[@]} -gt 0 ] || { echo "fuzz: no package list found in scripts/setup.sh"; exit 2; }
packages+=(clang libclang-rt-14-dev libomp-14-dev)
bash scripts/install_packages.sh "${packages[@]}"

if [ -z "$prebuilt" ]; then
  start=$SECONDS
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPARITY_FUZZ=ON \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang
  cmake --build "$build" -j"$(nproc)"
  echo "fuzz: build took $((SECONDS - start)) s"
else
  echo "fuzz: the targets built in $build"
fi

# halt_on_error, a status of 1 and a stack per report: libFuzzer saves the input of any report.
# quarantine_size_mb=64 (ASan's default is 256): freed memory held back to catch use-after-free
# counts in rss, and would hide, under the growth check below, what a target keeps per input.
# scripts/lsan.supp: libhdf5's own leaks on its error paths, nothing of ours.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:quarantine_size_mb=64:print_summary=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1"
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
# A target that runs the reference starts OpenMP threads; they must not spin between inputs.
export OMP_WAIT_POLICY=passive

# Memory that grows over a run is a per-input leak LSan cannot see (still reachable: a global
# cache, a registry, HDF5 state that is never released): fail when rss ends more than this much
# above where it stood once the seed corpus had run. libFuzzer's rss is the peak, so one input
# that briefly needs much memory counts too: tokenizer_fuzz once stepped from 195 to 369 MB at a
# single 28 KB input (2026-11-28) and stayed there (a tokenizer.json whose ids reached millions
# could do that through its dense id tables; such files are refused since); 512 MB leaves room
# for such a peak and still catches a leak of 20 KB an input over a 10-second run (about 25,000
# inputs).
rss_growth_limit_mb=512

logs="$build/logs"
mkdir -p "$logs"
failed=()
shopt -s nullglob
for src in fuzz/*_fuzz.cpp; do
  target="$(basename "$src" .cpp)"
  exe="$build/bin/$target"
  [ -x "$exe" ] || { echo "fuzz: $target: $exe was not built"; failed+=("$target"); continue; }
  work="$(mktemp -d)"
  # A copy: libFuzzer adds every input that reaches new code to its first corpus directory.
  [ -d "fuzz/corpus/$target" ] && cp -r "fuzz/corpus/$target/." "$work/"
  seeds="$(find "$work" -type f | wc -l)"
  mkdir -p "$findings/$target"
  before="$(ls -1 "$findings/$target")"
  log="$logs/$target.log"

  # -timeout: one input running 10 s is a hang. -rss_limit_mb (and the malloc limit it implies):
  # an unbounded allocation is a finding, not a dead CI machine. The outer timeout only guards
  # against libFuzzer itself not stopping.
  set +e
  timeout --signal=KILL $((seconds * 2 + 120)) "$exe" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$findings/$target/" -print_final_stats=1 \
    "$work" >"$log" 2>&1
  rc=$?
  set -e
  rm -rf "$work"

  after="$(ls -1 "$findings/$target")"
  new="$(comm -13 <(echo "$before") <(echo "$after") | sed '/^$/d')"
  # A target that fails on a seed never prints INITED: these may match nothing.
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1 || true)"
  rss_start="$( (grep -m1 -E '^#[0-9]+[[:space:]]+INITED' "$log" || true) | sed -n 's/.*rss: \([0-9]*\)Mb.*/\1/p')"
  rss_end="$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n 1 || true)"
  echo "fuzz: $target: ${runs:-?} inputs in ${seconds} s from $seeds seeds, rss ${rss_start:-?} -> ${rss_end:-?} MB, exit $rc"

  if [ -n "$new" ] || [ "$rc" -ne 0 ]; then
    echo "---- $target: the end of its log ($log)"
    tail -n 80 "$log"
    if [ -n "$new" ]; then
      while read -r f; do
        echo "fuzz: FINDING in $target: saved input fuzz-findings/$target/$f (reproduce: $build/bin/$target fuzz-findings/$target/$f)"
      done <<<"$new"
    else
      echo "fuzz: FINDING in $target: exit status $rc and no saved input (see the log above)"
    fi
    failed+=("$target")
  elif [ -n "$rss_start" ] && [ -n "$rss_end" ] && [ $((rss_end - rss_start)) -gt "$rss_growth_limit_mb" ]; then
    echo "fuzz: FINDING in $target: rss grew from $rss_start MB to $rss_end MB over the run (limit +$rss_growth_limit_mb MB): memory kept per input; no single input to save"
    failed+=("$target")
  fi
  rmdir "$findings/$target" 2>/dev/null || true  # keep only directories that hold findings
done
rmdir "$findings" 2>/dev/null || true

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs under fuzz-findings/, logs under $logs/)"
  exit 1
fi
echo "fuzz: every target ran ${seconds} s with no finding"
