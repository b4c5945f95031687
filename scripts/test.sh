#!/usr/bin/env bash
# The test suite: set up, build (warnings are errors for project code), run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DPARITY_WERROR=ON
ctest --test-dir build --output-on-failure -j"$(nproc)"
