#!/bin/bash
set -u
cd "$(dirname "$0")/.."
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
cmake --build build-device -j32 --target run > /tmp/build.log 2>&1 || exit 1
B=build-device/bin; M=/tmp/parity-models/20b
make_requests 16 20 400 /tmp/short-16.txt
for p in fp32 bf16; do for tp in 1 2; do
  timeout 100 $B/run $M --backend hip --precision $p --tensor-parallel $tp -m getp --no-progress -i /tmp/short-16.txt -n 64 --max-batch 16 --step-tokens 4096 --kv-memory 8G -o $OUT/s16-$p-$tp.txt 2>&1 | grep -E "^run: [0-9]|rror" | head -2
done; done
