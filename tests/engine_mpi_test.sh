#!/usr/bin/env bash
# run under MPI: `mpirun -np 2` on the cpu-f32 backend writes the same output as one process,
# with work handed out by rank 0 to both ranks. Usage: engine_mpi_test.sh RUN_BINARY MPIRUN
set -euo pipefail
# Under scripts/sanitize.sh (ASan + UBSan builds): OpenMPI keeps allocations from MPI_Init to
# exit in components it unloads at MPI_Finalize, so LeakSanitizer reports them with no module to
# name or suppress. Leak detection is off for this test's processes only; every other ASan and
# UBSan check stays on.
if [ -n "${ASAN_OPTIONS:-}" ]; then export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"; fi
run="$1"
mpirun="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 24); do
  case $((i % 5)) in
    0) echo "request $i: a longer prompt, with words and numbers $((i * 37)) and more words again" ;;
    1) echo "x$i" ;;
    2) echo "" ;;  # an empty line: a failed request, reported on its line by either way
    *) echo "Hello, request $i" ;;
  esac
done >"$dir/requests.txt"
common=(tiny --models-dir "$dir/models" -m getp --backend cpu-f32 -i "$dir/requests.txt" -n 16 -t 0.7 --top-p 0.9
        -s 5 --max-batch 3 --step-tokens 8 --text)
set +e
"$run" "${common[@]}" -o "$dir/one.txt" 2>"$dir/one.err"
one=$?
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
"$mpirun" "${root[@]}" --oversubscribe -np 2 "$run" "${common[@]}" --no-progress -o "$dir/two.txt" \
  >"$dir/two.out" 2>"$dir/two.err"
two=$?
set -e
echo "one process: exit $one; mpirun -np 2: exit $two"
grep '^run: ' "$dir/two.err" || true
[ "$one" -eq 1 ] || { echo "one process: expected exit 1 (empty lines fail)"; cat "$dir/one.err"; exit 1; }
[ "$two" -eq 1 ] || { echo "mpirun: expected exit 1"; cat "$dir/two.err" "$dir/two.out"; exit 1; }
cmp "$dir/one.txt" "$dir/two.txt" || { diff "$dir/one.txt" "$dir/two.txt" | head; exit 1; }
# Both ranks ran requests.
grep -q 'rank 1: [1-9]' "$dir/two.err" || { echo "rank 1 ran no request"; cat "$dir/two.err"; exit 1; }
echo "PASS: 2 ranks wrote the output of 1 ($(wc -l <"$dir/one.txt") lines)"
