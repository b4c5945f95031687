#!/usr/bin/env bash
# run under MPI: `mpirun -np 2` on the cpu-f32 backend writes the same output as one process,
# with work handed out by rank 0 to both ranks. Usage: engine_mpi_test.sh RUN_BINARY MPIRUN
set -euo pipefail
# Under scripts/sanitize.sh (ASan + UBSan builds): OpenMPI keeps allocations from MPI_Init to
# exit in components it unloads at MPI_Finalize, so LeakSanitizer reports them with no module to
# name or suppress. Leak detection is off for this test's processes only; every other ASan and
# UBSan check stays on.
if [ -n "${ASAN_OPTIONS:-}" ]; then export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"; fi
# Under UBSan every rank stops at its first report (halt_on_error), and the ranks get the
# sanitizers' settings from mpirun explicitly (-x) rather than by whatever the launcher passes on.
forward=()
if [ -n "${UBSAN_OPTIONS:-}" ]; then
  export UBSAN_OPTIONS="$UBSAN_OPTIONS:halt_on_error=1"
  forward+=(-x UBSAN_OPTIONS)
fi
if [ -n "${ASAN_OPTIONS:-}" ]; then forward+=(-x ASAN_OPTIONS); fi
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
mpi=("$mpirun" "${root[@]}" "${forward[@]}" --oversubscribe -np 2 "$run")
"${mpi[@]}" "${common[@]}" --no-progress -o "$dir/two.txt" >"$dir/two.out" 2>"$dir/two.err"
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

# one_and_two NAME EXPECTED ARGS...: `run ARGS` in one process and on 2 ranks, into
# $dir/one-NAME.txt and $dir/two-NAME.txt (standard error beside them, .err): both must exit
# EXPECTED and write the same output.
one_and_two() {
  local name="$1" expected="$2" one two
  shift 2
  set +e
  "$run" "$@" -o "$dir/one-$name.txt" 2>"$dir/one-$name.err"
  one=$?
  "${mpi[@]}" "$@" -o "$dir/two-$name.txt" >"$dir/two-$name.out" 2>"$dir/two-$name.err"
  two=$?
  set -e
  [ "$one" -eq "$expected" ] && [ "$two" -eq "$expected" ] ||
    { echo "$name: expected exit $expected and $expected, got $one and $two"; cat "$dir/two-$name.err"; exit 1; }
  cmp "$dir/one-$name.txt" "$dir/two-$name.txt" ||
    { diff "$dir/one-$name.txt" "$dir/two-$name.txt" | head; exit 1; }
}

# JSON Lines: each request's max_tokens and ignore_eos travel to the rank that runs it. The tiny
# model's first greedy token for "Hello" is made its stop token (a copy with that
# generation_config.json): the request that ignores it generates all its max_tokens, the other
# stops there.
echo Hello >"$dir/hello.txt"
"$run" tiny --models-dir "$dir/models" -m getp --backend cpu-f32 -t 0 -n 1 -i "$dir/hello.txt" \
  --no-progress -o "$dir/first.txt" 2>/dev/null
cp -r "$dir/models/tiny" "$dir/stop-model"
echo "{\"eos_token_id\": $(cat "$dir/first.txt")}" >"$dir/stop-model/generation_config.json"
for i in $(seq 1 16); do
  echo "{\"prompt\": \"Hello\", \"max_tokens\": $((i % 7 + 2)), \"ignore_eos\": $([ $((i % 2)) -eq 0 ] && echo true || echo false)}"
done >"$dir/requests.jsonl"
jsonl=("$dir/stop-model" -m getp --backend cpu-f32 -t 0 -i "$dir/requests.jsonl" -n 50 --max-batch 2
       --no-progress)
one_and_two jsonl 0 "${jsonl[@]}"
i=0
while read -r line; do
  i=$((i + 1))
  n=$(echo "$line" | wc -w)
  expected=1
  [ $((i % 2)) -eq 0 ] && expected=$((i % 7 + 2))
  [ "$n" -eq "$expected" ] || { echo "JSON Lines, line $i: $n tokens, expected $expected"; exit 1; }
done <"$dir/two-jsonl.txt"
grep -q 'rank 1: [1-9]' "$dir/two-jsonl.err" || { echo "rank 1 ran no request"; cat "$dir/two-jsonl.err"; exit 1; }
# Both ranks' times per output token reach the summary: 8 requests of 2 tokens or more.
grep -q '^run: 16 requests (0 failed), .*TPOT p50 [0-9.]* ms' "$dir/two-jsonl.err" ||
  { echo "no TPOT in the summary"; cat "$dir/two-jsonl.err"; exit 1; }
echo "PASS: JSON Lines' max_tokens and ignore_eos on 2 ranks as on 1"

# Every request refused by the engine (longer than --context): results with no tokens and ranks
# with no time to first token cross between the ranks as empty vectors (a null memcpy before).
for i in $(seq 1 12); do echo "request $i, with more words than the context holds"; done >"$dir/long.txt"
tiny=(tiny --models-dir "$dir/models" -m getp --backend cpu-f32 -i "$dir/long.txt" -n 4 --context 2
      --no-progress)
one_and_two refused 1 "${tiny[@]}"
echo "PASS: every request refused, on 2 ranks as on 1"

# An error before the work starts (here a directory as the request file, which read as an empty
# file before): one line from one rank, exit 2 through MPI_Finalize (no MPI_ABORT banner), no
# output.
set +e
"${mpi[@]}" tiny --models-dir "$dir/models" -m getp --backend cpu-f32 -i "$dir" -o "$dir/bad.txt" \
  >"$dir/bad.out" 2>"$dir/bad.err"
bad=$?
set -e
errors=$(grep -c '^run: error: ' "$dir/bad.err" || true)
if [ "$bad" -ne 2 ] || [ "$errors" -ne 1 ] || ! grep -q "^run: error: $dir: is a directory" "$dir/bad.err" ||
  grep -q 'MPI_ABORT' "$dir/bad.err" "$dir/bad.out" || [ -e "$dir/bad.txt" ]; then
  echo "a directory as the request file under mpirun: exit $bad, $errors error lines:"
  cat "$dir/bad.err" "$dir/bad.out"
  exit 1
fi
echo "PASS: an error before the work is one line and exit 2 on 2 ranks"
