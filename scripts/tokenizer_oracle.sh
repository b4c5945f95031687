#!/usr/bin/env bash
# The tokenizer's oracle: js-tiktoken (npm, pinned by tools/tokenizer_oracle/package-lock.json)
# writes OUT_DIR (default build/oracle/o200k_harmony):
#   tokenizer.json        Hugging Face format, from o200k_base's ranks (checked against the official
#                         file's sha256) and the o200k_harmony special tokens 199998..201087
#   corpus.txt            the copy of tests/data/tokenizer_corpus.txt the encodings are of
#   encode.jsonl          js-tiktoken's ids of each case, special tokens as text
#   encode_special.jsonl  the same with the special tokens allowed
#   decode.jsonl          js-tiktoken's decoding of encode.jsonl
#   random.jsonl          3000 random texts of the corpus's characters and their ids
# tests/tokenizer_test.cpp (TokenizerOracle) compares the C++ tokenizer with them, and
# parity-synth --preset 20b|120b copies tokenizer.json into the checkpoints it writes.
# Usage: scripts/tokenizer_oracle.sh [OUT_DIR]
# The npm packages go to tools/tokenizer_oracle/node_modules (git-ignored), installed again only
# when the lock file changes; OUT_DIR is rewritten only when an input changes.
# Without node or npm, or with the registry unreachable, this fails. A developer without them may
# set PARITY_NO_NPM=1: nothing is generated and the oracle test skips, saying so. CI (CI=true)
# refuses that.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/oracle/o200k_harmony}"
pkg=tools/tokenizer_oracle
corpus=tests/data/tokenizer_corpus.txt

if [ "${PARITY_NO_NPM:-}" = 1 ]; then
  if [ "${CI:-}" = true ]; then
    echo "tokenizer oracle: error: PARITY_NO_NPM=1 in CI; the oracle must run there" >&2
    exit 1
  fi
  echo "tokenizer oracle: skipped (PARITY_NO_NPM=1); the tokenizer oracle test will skip"
  exit 0
fi
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "tokenizer oracle: error: $tool not found (scripts/setup.sh installs nodejs and npm;" \
      "PARITY_NO_NPM=1 skips the oracle)" >&2
    exit 1
  fi
done

lock_sum="$(sha256sum "$pkg/package-lock.json" | cut -d' ' -f1)"
stamp="$pkg/node_modules/.parity-lock-sha256"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$lock_sum" ]; then
  start=$SECONDS
  if ! npm ci --prefix "$pkg" --no-audit --no-fund --loglevel=error; then
    echo "tokenizer oracle: error: npm ci failed in $pkg (is the npm registry reachable?" \
      "PARITY_NO_NPM=1 skips the oracle)" >&2
    exit 1
  fi
  echo "$lock_sum" >"$stamp"
  echo "tokenizer oracle: npm ci took $((SECONDS - start)) s"
fi

inputs_sum="$(cat "$pkg/oracle.mjs" "$pkg/package-lock.json" "$corpus" | sha256sum | cut -d' ' -f1)"
if [ -f "$out/tokenizer.json" ] && [ "$(cat "$out/inputs.sha256" 2>/dev/null || true)" = "$inputs_sum" ]; then
  echo "tokenizer oracle: $out is up to date"
  exit 0
fi

# Written beside OUT_DIR and moved into place whole: a failed run leaves the old one or none.
start=$SECONDS
tmp="$out.partial.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
oracle=(node "$pkg/oracle.mjs")
"${oracle[@]}" tokenizer-json "$tmp/tokenizer.json"
cp "$corpus" "$tmp/corpus.txt"
"${oracle[@]}" encode "$tmp/corpus.txt" >"$tmp/encode.jsonl"
"${oracle[@]}" encode-special "$tmp/corpus.txt" >"$tmp/encode_special.jsonl"
"${oracle[@]}" decode "$tmp/encode.jsonl" >"$tmp/decode.jsonl"
"${oracle[@]}" random "$tmp/corpus.txt" 3000 20261122 >"$tmp/random.jsonl"
echo "$inputs_sum" >"$tmp/inputs.sha256"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "tokenizer oracle: wrote $out ($(wc -l <"$out/encode.jsonl") corpus texts," \
  "$(wc -l <"$out/random.jsonl") random texts) in $((SECONDS - start)) s"
