#!/usr/bin/env bash
# The HTML report as a browser shows it: traces the tiny model with a fault injected at one
# stage and layer, renders report.html in headless Chromium, and checks the page's DOM for the
# verdict and for the culprit cell outlined in the heatmap; keeps a screenshot.
# Usage: scripts/html_check.sh [BUILD_DIR] (default build); needs chromium (Debian package).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
out="$build/html-check"
rm -rf "$out"
mkdir -p "$out"
set +e
"$build/bin/parity-trace" --model tiny --models-dir "$build/models" \
  --tokens 1,17,300,42,999,5,77,128,256,3,1000,64 --candidate cpu-f32 --inject scores:2 \
  --out "$out/trace" >"$out/trace.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || { echo "html check: parity-trace exit $rc (expected 1: the injected fault)"; cat "$out/trace.log"; exit 1; }
chrome=(chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run
        --disable-background-networking --disable-component-update --disable-sync
        --user-data-dir="$out/profile" --window-size=1400,1000)
page="file://$(realpath "$out/trace/report.html")"
timeout 120 "${chrome[@]}" --dump-dom "$page" >"$out/dom.html" 2>"$out/chromium.log"
timeout 120 "${chrome[@]}" --screenshot="$out/report.png" "$page" >>"$out/chromium.log" 2>&1
fail() { echo "html check: $*"; exit 1; }
grep -q 'class="verdict diverged"' "$out/dom.html" || fail "no diverged verdict in the rendered page"
grep -q 'first divergence at position 0, layer 2, stage scores' "$out/dom.html" ||
  fail "the verdict does not name the injected stage"
# The culprit cell: stage scores, layer 2, outlined ("first") in the local heatmap.
grep -q 'class="b6 first" title="scores layer 2:' "$out/dom.html" ||
  grep -q 'class="worst first" title="scores layer 2:' "$out/dom.html" ||
  fail "the culprit cell (scores, layer 2) is not outlined in the heatmap"
[ -s "$out/report.png" ] || fail "no screenshot"
echo "html check: the rendered report names scores at layer 2 and outlines its cell; screenshot $out/report.png"
