#!/bin/bash
set -u
cd "$(dirname "$0")/.."
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
B=build-device/bin; M=/tmp/parity-models/20b
make_requests 256 20 400 /tmp/short-256.txt
for tp in 1 2; do for p in bf16 fp32; do
  echo "== tp$tp $p 256"
  timeout 100 $B/run $M --backend hip --precision $p --tensor-parallel $tp -m getp --no-progress -i /tmp/short-256.txt -n 128 --max-batch 256 --step-tokens 4096 --kv-memory 16G -o /tmp/x.txt 2>&1 | grep -E "^run: [0-9]|rror" | head -2
done; done
for n in 1 64; do
  echo "== tp2 bf16 kernel times batch $n"
  timeout 100 $B/run $M --backend hip --precision bf16 --tensor-parallel 2 -m getp --no-progress -i /tmp/short-$n.txt -n 64 --max-batch $n --step-tokens 4096 --kv-memory 8G --kernel-times -o /tmp/x.txt 2>&1 | sed -n '/kernel times/,/^all/p' | head -24
done
