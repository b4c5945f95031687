#!/usr/bin/env bash
# The test suite: set up, build (warnings are errors for project code), run every test. The
# suite's summary line is printed last (ctest lists the skipped device tests after it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DPARITY_WERROR=ON
scripts/tokenizer_oracle.sh  # js-tiktoken's expected encodings; PARITY_NO_NPM=1 skips
set +e
ctest --test-dir build --output-on-failure -j"$(nproc)" 2>&1 | tee build/ctest.log
rc=${PIPESTATUS[0]}
set -e
skipped="$(grep -c '(Skipped)' build/ctest.log || true)"
[ "$skipped" -gt 0 ] && echo "($skipped tests skipped: device tests need a GPU; the reason is in each test's output)"
grep -E "tests passed, [0-9]+ tests failed out of" build/ctest.log | tail -n 1
exit "$rc"
