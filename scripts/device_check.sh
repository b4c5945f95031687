#!/usr/bin/env bash
# The device path's checks on a GPU machine: build, the test suite (device tests included),
# compute-sanitizer, the tiny and transformers-initialised models traced on the device, the
# synthetic 20b (and its realistic-magnitude twin) traced at positions 0, 200, 1000 and 2049 with
# replay and derived bounds, the replay's cost, and the decode benchmark against the
# copy-bandwidth floor.
#
# Usage: scripts/device_check.sh [STEP...]
#   STEP: build tests sanitize tiny hf 20b 20b-real replay-cost bench engine engine-bench
#         hf-generate engine-gpus hf-capture long-pos precision-bench serving-bench
#         tensor-parallel stalls profile ab (default: all but the last ten)
# Environment: GPU=cuda|hip (default cuda), BUILD_DIR (build-device), LOG_DIR (device-logs, or
# $OUT when set), MODELS_DIR (where the 20b checkpoint is written; default /tmp/parity-models),
# PRECISION (fp32 or bf16: the device's --precision for tiny, hf, 20b, 20b-real, bench,
# engine-bench and long-pos; default the tools' own), CUDA_ARCH / HIP_ARCH (90a / gfx90a), DEPS_DIR (build-devdeps: the libraries the GPU machine
# lacks, from scripts/device_deps.sh, used when present).
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
# The libraries the GPU machine lacks, when carried (scripts/device_deps.sh).
DEPS_DIR="${DEPS_DIR:-build-devdeps}"
if [ -d "$DEPS_DIR/lib" ]; then
  DEPS_DIR="$(cd "$DEPS_DIR" && pwd)"
  (cd "$DEPS_DIR/lib" && ln -sf libxxhash.so.0.8.1 libxxhash.so.0 && ln -sf libxxhash.so.0 libxxhash.so &&
    ln -sf libpugixml.so.1.13 libpugixml.so.1 && ln -sf libpugixml.so.1 libpugixml.so &&
    ln -sf libpcre2-8.so.0.11.2 libpcre2-8.so.0 && ln -sf libpcre2-8.so.0 libpcre2-8.so)
  sed -i "s|@PREFIX@|$DEPS_DIR|" "$DEPS_DIR"/lib/pkgconfig/*.pc
  export CMAKE_PREFIX_PATH="$DEPS_DIR${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$DEPS_DIR/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$DEPS_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build tests sanitize tiny hf 20b 20b-real replay-cost bench engine engine-bench)
# The o200k_harmony tokenizer.json for the 20b (parity-synth copies it), when carried.
synth_tokenizer=()
[ -f "$DEPS_DIR/o200k_harmony/tokenizer.json" ] && synth_tokenizer=(--tokenizer "$DEPS_DIR/o200k_harmony/tokenizer.json")
bin="$BUILD_DIR/bin"
prec=(${PRECISION:+--precision "$PRECISION"})
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
  local arch_flag=-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}"
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
  logged tests "$bin/parity_tests" \
    --gtest_filter='DeviceKernels.*:*CandidateTest*hip*:*InjectionTest*hip_*:*Mutation*hip*' --gtest_brief=1
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
  # racecheck: the bf16 tilings' real shapes (the warpgroup tiles' many blocks) take it past the
  # limit; MoeTilingsAgreeInBf16SmallShapes runs the same tiles under it.
  logged sanitize "${cs[@]}" --tool racecheck "$bin/parity_tests" \
    --gtest_filter='DeviceKernels.*:-DeviceKernels.MoeTilingsAgreeInBf16' --gtest_brief=1
  for tool in memcheck racecheck synccheck initcheck; do
    logged sanitize "${cs[@]}" --tool "$tool" "$bin/parity-trace" --model tiny --models-dir "$MODELS_DIR" \
      --tokens "$tiny_tokens" --candidate hip --out "$LOG_DIR/sanitize-$tool"
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG_DIR/sanitize.log" | sort | uniq -c
  rm -rf "$LOG_DIR"/sanitize-*
}

step_tiny() {
  logged tiny "$bin/parity-trace" --model tiny --models-dir "$MODELS_DIR" --tokens "$tiny_tokens" \
    --generate 8 --candidate hip "${prec[@]}" --out "$LOG_DIR/tiny"
  grep -E "^(PASS|DIVERGED)|^candidate|^timing|^generated" "$LOG_DIR/tiny.log"
  cp "$LOG_DIR/tiny/report.txt" "$LOG_DIR/tiny-report.txt"
  rm -rf "$LOG_DIR/tiny"
  # Far into the tiny model's context (4096): float32 RoPE angles at large positions.
  logged tiny "$bin/parity-trace" --model tiny --models-dir "$MODELS_DIR" --token 5 --pos 4000 \
    --candidate hip "${prec[@]}" --out "$LOG_DIR/tiny-4000"
  grep -E "^(PASS|DIVERGED)" "$LOG_DIR/tiny.log" | tail -n 1
  rm -rf "$LOG_DIR/tiny-4000"
}

# The transformers-initialised models (golden/hf-*; hf-large has norm weights, biases and sinks
# of real checkpoints' size), 200 positions, all traced.
step_hf() {
  local tokens
  tokens="$(awk 'BEGIN { for (i = 0; i < 200; i++) printf "%s%d", (i ? "," : ""), (7 + 7919 * i) % 512 }')"
  for m in hf-tiny hf-large; do
    logged hf "$bin/parity-trace" --model "golden/$m" --tokens "$tokens" --candidate hip "${prec[@]}" --out "$LOG_DIR/$m"
    grep -E "^(PASS|DIVERGED)" "$LOG_DIR/hf.log" | tail -n 1
    cp "$LOG_DIR/$m/report.txt" "$LOG_DIR/$m-report.txt"
    rm -rf "$LOG_DIR/$m"
  done
}

# Traces the 20b-shaped model $1 (a preset name under MODELS_DIR) at the positions $2...,
# logging to LOG_DIR/$1.log; a divergence (exit 1) is a result to record, an error stops.
trace_20b() {
  local model="$1"
  shift
  local log="$LOG_DIR/$model.log"
  for pos in "$@"; do
    set +e
    "$bin/parity-trace" --model "$MODELS_DIR/$model" --token 0 --pos "$pos" \
      --candidate hip "${prec[@]}" --step 256 --out "$LOG_DIR/$model-pos$pos" >>"$log" 2>&1
    local rc=$?
    set -e
    echo "$model pos $pos: parity-trace exit $rc" | tee -a "$log"
    [ $rc -ge 2 ] && { tail -n 40 "$log"; return 1; }
    grep -E "^(PASS|DIVERGED)|^timing" "$LOG_DIR/$model-pos$pos/report.txt" | sed "s/^/  /" | tee -a "$log"
    python3 - "$LOG_DIR/$model-pos$pos/report.json" <<'PY' | tee -a "$log"
import json, sys
j = json.load(open(sys.argv[1]))
worst = {}
for d in j["datasets"]:
    for side in ("local", "accumulated"):
        s = (d.get(side) or {}).get("share")
        if s is not None:
            key = (side, d["stage"])
            worst[key] = max(worst.get(key, 0), s)
for side in ("local", "accumulated"):
    print("  " + side + " share, max per stage: " +
          ", ".join(f"{st} {v:.3g}" for (sd, st), v in sorted(worst.items()) if sd == side))
PY
    cp "$LOG_DIR/$model-pos$pos/report.txt" "$LOG_DIR/$model-pos$pos-report.txt"
    rm -rf "$LOG_DIR/$model-pos$pos"
  done
}

step_20b() {
  if [ ! -f "$MODELS_DIR/20b/config.json" ]; then
    logged 20b "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
    du -sh "$MODELS_DIR/20b" | tee -a "$LOG_DIR/20b.log"
  fi
  trace_20b 20b 0 200 1000 2049
}

step_20b-real() {
  if [ ! -f "$MODELS_DIR/20b-real/config.json" ]; then
    logged 20b-real "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --magnitudes realistic --out "$MODELS_DIR/20b-real"
  fi
  trace_20b 20b-real 0 200
}

# What replay costs: the same trace of the 20b with and without it. Without replay the
# accumulated error is judged, and it may well "diverge" (exit 1): that is the point.
step_replay-cost() {
  for flag in "" --no-replay; do
    set +e
    "$bin/parity-trace" --model 20b --models-dir "$MODELS_DIR" --token 0 --pos 64 --candidate hip \
      $flag --out "$LOG_DIR/replay-cost" >>"$LOG_DIR/replay-cost.log" 2>&1
    local rc=$?
    set -e
    [ $rc -ge 2 ] && { tail -n 40 "$LOG_DIR/replay-cost.log"; return 1; }
    grep -E "^(PASS|DIVERGED)|^timing" "$LOG_DIR/replay-cost/report.txt" | sed "s/^/  ${flag:-replay} (exit $rc): /" |
      tee -a "$LOG_DIR/replay-cost.log"
    rm -rf "$LOG_DIR/replay-cost"
  done
}

step_bench() {
  [ -f "$MODELS_DIR/20b/config.json" ] || logged bench "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  logged bench "$bin/parity-bench" --model 20b --models-dir "$MODELS_DIR" --backend hip "${prec[@]}" \
    --positions 128 --warmup 16 -q
  grep -E "median|floor|bandwidth|work per" "$LOG_DIR/bench.log" | tail -n 4
}

# The engine's device runner and the device sampler: their tests must run here, not skip.
step_engine() {
  logged engine "$bin/parity_tests" --gtest_filter='*EngineDevice.*:DeviceSampler*:Backends/EngineBatchInvariance.*' \
    --gtest_brief=0
  if grep -q "SKIPPED" "$LOG_DIR/engine.log"; then
    echo "FAILED: engine device tests skipped on the GPU machine"
    return 1
  fi
  grep -E "PASSED|FAILED|sampler timing|excused" "$LOG_DIR/engine.log" | tail -n 12
}

# Request files for the engine benchmarks: N prompts of mixed lengths (words of English text).
make_requests() {  # make_requests N WORDS_MIN WORDS_MAX FILE
  python3 - "$@" <<'PY'
import random, sys
n, lo, hi, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
words = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "so no will more about can what out other up into only some could time these two may "
         "then do first any my now such like our over man me even most made after also did many "
         "before must through back years where much your way well down should because each just "
         "those people how too little state good very make world still own see men work long get "
         "here between both life being under never day same another know while last might us great "
         "old year off come since against go came right used take three").split()
rng = random.Random(n * 1000 + lo)
with open(path, "w") as f:
    for i in range(n):
        k = rng.randint(lo, hi)
        f.write(" ".join(rng.choice(words) for _ in range(k)).capitalize() + ".\n")
PY
}

# `run` on the synthetic 20b: batch-1 decode against the floor (parity-bench measures the copy
# bandwidth), aggregate output tokens/s and time to first token at 1, 8, 32, 64 and 256
# concurrent requests (prompts of 20-400 words, 128 generated tokens each), prefill tokens/s on
# 2,048-token prompts, and the per-kernel times at batch 1 and 64.
step_engine-bench() {
  [ -f "$MODELS_DIR/20b/config.json" ] || logged engine-bench "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  [ -f "$MODELS_DIR/20b/tokenizer.json" ] || { echo "engine-bench: the 20b has no tokenizer.json"; return 1; }
  local req="$LOG_DIR/requests" run=("$bin/run" "$MODELS_DIR/20b" --backend hip "${prec[@]}" -m getp --no-progress)
  mkdir -p "$req"
  for n in 1 8 32 64 256; do make_requests "$n" 20 400 "$req/mixed-$n.txt"; done
  make_requests 16 1600 1700 "$req/long-16.txt"  # about 2,000 tokens each
  logged engine-bench "${run[@]}" -i "$req/mixed-1.txt" -o "$req/out-1.txt" -n 256 --max-batch 1 --kernel-times
  for n in 1 8 32 64 256; do
    logged engine-bench "${run[@]}" -i "$req/mixed-$n.txt" -o "$req/out-$n.txt" -n 128 --max-batch "$n" \
      --step-tokens 2048 --context 4096
  done
  logged engine-bench "${run[@]}" -i "$req/mixed-64.txt" -o "$req/out-64k.txt" -n 32 --max-batch 64 \
    --step-tokens 2048 --kernel-times
  logged engine-bench "${run[@]}" -i "$req/long-16.txt" -o "$req/out-long.txt" -n 1 --max-batch 16 \
    --step-tokens 4096 --context 4096
  logged engine-bench "$bin/parity-bench" --model 20b --models-dir "$MODELS_DIR" --backend hip "${prec[@]}" \
    --positions 128 --warmup 16 -q
  grep -E "^run: [0-9]|median|floor|bandwidth" "$LOG_DIR/engine-bench.log"
}

# The same workload through transformers' generate on the same GPU (tools/hf_generate_bench.py).
step_hf-generate() {
  python3 -c "import torch, transformers" 2>/dev/null || { echo "hf-generate: no torch/transformers here"; return 0; }
  local req="$LOG_DIR/requests"
  [ -f "$req/mixed-64.txt" ] || { mkdir -p "$req"; make_requests 64 20 400 "$req/mixed-64.txt"; }
  set +e
  timeout 420 python3 tools/hf_generate_bench.py "$MODELS_DIR/20b" "$req/mixed-64.txt" --max-tokens 128 \
    --batches "${HF_BATCHES:-1,8,32,64}" >>"$LOG_DIR/hf-generate.log" 2>&1
  echo "hf-generate: exit $?" | tee -a "$LOG_DIR/hf-generate.log"
  set -e
  grep -E "^N=|loaded|torch" "$LOG_DIR/hf-generate.log"
}

# transformers' GptOss captured in every dtype (python -m parity_capture.hf) and judged by
# parity-trace --candidate-trace: HF_MODELS (default golden/hf-tiny and golden/hf-large at
# HF_TOKENS positions, 40 by default: past the sliding window of 8; "20b" and "120b" are the
# synthetic models at HF_20B_TOKENS positions, synthesized under MODELS_DIR), HF_DTYPES (default all four), and on
# hf-large in bfloat16 also with --cast-buffers (model.to(dtype) rounds RoPE's inv_freq). A
# capture that fails (a model too large for the GPU in that dtype) is logged and skipped. The
# captures stay in LOG_DIR/captures; transformers' own GptOss code is logged first. HF_DEVICE
# (default cuda): "auto" spreads the layers over every GPU (the 20b in float64 and the 120b in
# bfloat16 need two H200s).
step_hf-capture() {
  python3 -c "import torch, transformers" 2>/dev/null || { echo "hf-capture: no torch/transformers here"; return 0; }
  local caps="$LOG_DIR/captures" tokens
  mkdir -p "$caps"
  python3 - >"$LOG_DIR/transformers-source.txt" 2>&1 <<'PY' || true
import inspect, torch, transformers
from transformers.models.gpt_oss import modeling_gpt_oss as mg
print("transformers", transformers.__version__, "torch", torch.__version__)
for name in ("GptOssRMSNorm", "GptOssExperts", "GptOssTopKRouter", "GptOssMLP", "GptOssRotaryEmbedding",
             "_apply_rotary_emb", "apply_rotary_pos_emb", "eager_attention_forward", "GptOssAttention",
             "GptOssDecoderLayer"):
    obj = getattr(mg, name, None)
    print("=" * 20, name)
    print(inspect.getsource(obj) if obj is not None else "(absent)")
PY
  tokens="$(awk -v n="${HF_TOKENS:-40}" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), (7 + 7919 * i) % 512 }')"
  local runs=()
  for m in ${HF_MODELS:-hf-tiny hf-large}; do
    for dtype in ${HF_DTYPES:-float64 float32 bfloat16 float16}; do
      runs+=("$m:$dtype:")
      [ "$m" = hf-large ] && [ "$dtype" = bfloat16 ] && runs+=("$m:$dtype:--cast-buffers")
    done
  done
  for r in "${runs[@]}"; do
    local m="${r%%:*}" rest="${r#*:}"
    local dtype="${rest%%:*}" extra="${rest#*:}"
    local dir="golden/$m" tk="$tokens" name="$m-$dtype${extra:+-cast}"
    if [ "$m" = 20b ] || [ "$m" = 120b ]; then
      dir="$MODELS_DIR/$m"
      [ -f "$dir/config.json" ] || logged hf-capture "$bin/parity-synth" --preset "$m" "${synth_tokenizer[@]}" --out "$dir"
      tk="$(awk -v n="${HF_20B_TOKENS:-15}" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), (1 + 7919 * i) % 201088 }')"
    fi
    local t0=$SECONDS
    set +e
    PYTHONPATH=python python3 -m parity_capture.hf "$dir" --tokens "$tk" --out "$caps/$name.h5" \
      --dtype "$dtype" --device "${HF_DEVICE:-cuda}" $extra >>"$LOG_DIR/hf-capture.log" 2>&1
    local rc=$?
    set -e
    echo "$name: capture exit $rc in $((SECONDS - t0)) s" | tee -a "$LOG_DIR/hf-capture.log"
    [ $rc -eq 0 ] || { tail -n 5 "$LOG_DIR/hf-capture.log"; continue; }
    [ -x "$bin/parity-trace" ] || continue
    set +e
    "$bin/parity-trace" --model "$dir" --candidate-trace "$caps/$name.h5" --out "$LOG_DIR/hfcap-$name" \
      >>"$LOG_DIR/hf-capture.log" 2>&1
    echo "$name: parity-trace exit $?" | tee -a "$LOG_DIR/hf-capture.log"
    set -e
    grep -E "^(PASS|DIVERGED)|^timing|^warning" "$LOG_DIR/hfcap-$name/report.txt" | cut -c1-400 | sed "s/^/  /" |
      tee -a "$LOG_DIR/hf-capture.log"
    cp "$LOG_DIR/hfcap-$name/report.txt" "$LOG_DIR/hfcap-$name-report.txt"
    python3 - "$LOG_DIR/hfcap-$name/report.json" <<'PY' | tee -a "$LOG_DIR/hf-capture.log"
import json, sys
j = json.load(open(sys.argv[1]))
worst, failed = {}, {}
for d in j["datasets"]:
    s = (d.get("local") or {}).get("share")
    if d["stage"] in ("topk_idx", "sampled") or s is None:
        continue
    worst[d["stage"]] = max(worst.get(d["stage"], 0), s)
    if d["status"] == "fail":
        failed[d["stage"]] = failed.get(d["stage"], 0) + 1
print("  local share, max per stage: " + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
if failed:
    print("  failed datasets per stage: " + ", ".join(f"{k} {v}" for k, v in failed.items()))
PY
    rm -rf "$LOG_DIR/hfcap-$name"
  done
  ls -la "$caps" | tee -a "$LOG_DIR/hf-capture.log"
}

# Long positions at the cost of one: the synthetic 20b at position LONG_POS (default 32768) with
# --skip-reference-prefix (the device runs the prefix and hands its KV cache to the reference,
# which recomputes that one position from it), and at 2049 (LONG_RUNS="POS:FLAGS ..." chooses;
# "2049:" runs the reference's prefix as before, for comparison).
step_long-pos() {
  [ -f "$MODELS_DIR/20b/config.json" ] || logged long-pos "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  local runs=(${LONG_RUNS:-"2049:--skip-reference-prefix" "${LONG_POS:-32768}:--skip-reference-prefix"})
  for r in "${runs[@]}"; do
    local pos="${r%%:*}" flag="${r#*:}" t0=$SECONDS
    set +e
    "$bin/parity-trace" --model "$MODELS_DIR/20b" --token 0 --pos "$pos" --candidate hip "${prec[@]}" --step 2048 \
      $flag --out "$LOG_DIR/long-$pos" >>"$LOG_DIR/long-pos.log" 2>&1
    local rc=$?
    set -e
    echo "20b pos $pos ${flag:-(reference prefix run)}: exit $rc in $((SECONDS - t0)) s" | tee -a "$LOG_DIR/long-pos.log"
    [ $rc -ge 2 ] && { tail -n 20 "$LOG_DIR/long-pos.log"; return 1; }
    grep -E "^(PASS|DIVERGED)|^timing" "$LOG_DIR/long-$pos/report.txt" | cut -c1-600 | sed "s/^/  /" | tee -a "$LOG_DIR/long-pos.log"
    rm -rf "$LOG_DIR/long-$pos"
  done
}

# Several GPUs of one host: the same 128 requests (64 tokens each) on 1 GPU, on every GPU (--gpus all), and
# through mpirun with one rank per GPU; the outputs must be equal.
step_engine-gpus() {
  [ -f "$MODELS_DIR/20b/config.json" ] || logged engine-gpus "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  local req="$LOG_DIR/requests" run=("$bin/run" "$MODELS_DIR/20b" --backend hip -m getp --no-progress)
  mkdir -p "$req"
  make_requests 128 20 400 "$req/mixed-128.txt"
  local gpus
  gpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
  logged engine-gpus "${run[@]}" -i "$req/mixed-128.txt" -o "$req/gpus-1.txt" -n 64 --max-batch 64 --step-tokens 2048
  logged engine-gpus "${run[@]}" -i "$req/mixed-128.txt" -o "$req/gpus-all.txt" -n 64 --max-batch 64 --step-tokens 2048 \
    --gpus all
  cmp "$req/gpus-1.txt" "$req/gpus-all.txt" | tee -a "$LOG_DIR/engine-gpus.log"
  if command -v mpirun >/dev/null; then
    logged engine-gpus mpirun --allow-run-as-root -np "$gpus" "${run[@]}" -i "$req/mixed-128.txt" \
      -o "$req/mpi.txt" -n 64 --max-batch 64 --step-tokens 2048
    cmp "$req/gpus-1.txt" "$req/mpi.txt" | tee -a "$LOG_DIR/engine-gpus.log"
  fi
  grep -E "^run: |^run:   " "$LOG_DIR/engine-gpus.log"
}

# The engine split over two GPUs (needs two): the tensor-parallel tests (the NCCL group, the
# rank-order sum, the engine's tokens against one GPU's, the traced group and its planted rank
# bugs), then the 20b traced split at positions 0 and 200 (reference prefix, replay) and 1000 and
# 4000 (--skip-reference-prefix), in the device's precision (PRECISION, else fp32).
step_tensor-parallel() {
  [ -f "$MODELS_DIR/20b/config.json" ] || logged tensor-parallel "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  logged tensor-parallel "$bin/parity_tests" \
    --gtest_filter='NcclGroup.*:EngineTensorParallel.*:DeviceKernels.RankSum*:TraceGroup*' --gtest_brief=1
  local runs=("0:" "200:" "1000:--skip-reference-prefix" "4000:--skip-reference-prefix")
  for r in "${runs[@]}"; do
    local pos="${r%%:*}" flag="${r#*:}"
    logged tensor-parallel "$bin/parity-trace" --model "$MODELS_DIR/20b" --token 5 --pos "$pos" --candidate hip \
      "${prec[@]}" --tensor-parallel 2 $flag --out "$LOG_DIR/tp-$pos"
    grep -E "^(PASS|DIVERGED)" "$LOG_DIR/tp-$pos/report.txt" | cut -c1-300 | sed "s/^/  pos $pos: /"
    rm -rf "$LOG_DIR/tp-$pos"
  done
}

# fp32 against bf16 on the same machine, one after the other: batch-1 decode (parity-bench), 64
# and 256 concurrent requests (128 tokens each), prefill of 16 prompts of about 2,000 tokens;
# the outputs' greedy tokens of the two precisions compared (how many requests differ).
step_precision-bench() {
  [ -f "$MODELS_DIR/20b/config.json" ] || logged precision-bench "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  [ -f "$MODELS_DIR/20b/tokenizer.json" ] || logged precision-bench "$bin/parity-synth" --preset 20b \
    "${synth_tokenizer[@]}" --tokenizer-only --out "$MODELS_DIR/20b"
  local req="$LOG_DIR/requests"
  mkdir -p "$req"
  make_requests 64 20 400 "$req/mixed-64.txt"
  make_requests 256 20 400 "$req/mixed-256.txt"
  make_requests 16 1600 1700 "$req/long-16.txt"
  for p in fp32 bf16; do
    local run=("$bin/run" "$MODELS_DIR/20b" --backend hip --precision "$p" -m getp --no-progress)
    logged precision-bench "$bin/parity-bench" --model 20b --models-dir "$MODELS_DIR" --backend hip \
      --precision "$p" --positions 128 --warmup 16 -q
    for n in 64 256; do
      logged precision-bench "${run[@]}" -i "$req/mixed-$n.txt" -o "$req/$p-$n.txt" -n 128 --max-batch "$n" \
        --step-tokens 2048 --context 4096
    done
    logged precision-bench "${run[@]}" -i "$req/long-16.txt" -o "$req/$p-long.txt" -n 1 --max-batch 16 \
      --step-tokens 4096 --context 4096
  done
  for n in 64 256 long; do
    echo "requests whose tokens differ between fp32 and bf16 ($n): $(diff <(cut -f1 "$req/fp32-$n.txt") \
      <(cut -f1 "$req/bf16-$n.txt") | grep -c '^<' || true)" | tee -a "$LOG_DIR/precision-bench.log"
  done
  grep -E "^== |^run: [0-9]|median|floor|differ" "$LOG_DIR/precision-bench.log" | grep -v "^== .*make_requests"
}

# `run` as `vllm bench serve` measures it, on the synthetic 20b with the limits it sizes from the
# GPU's memory: the ShareGPT-shaped, prefill-heavy and decode-heavy mixes of
# scripts/bench_requests.py (SERVING_COUNT requests each; default 1000, 256 and 256).
step_serving-bench() {
  [ -f "$MODELS_DIR/20b/config.json" ] || logged serving-bench "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  [ -f "$MODELS_DIR/20b/tokenizer.json" ] || logged serving-bench "$bin/parity-synth" --preset 20b \
    "${synth_tokenizer[@]}" --tokenizer-only --out "$MODELS_DIR/20b"
  local req="$LOG_DIR/requests" run=("$bin/run" "$MODELS_DIR/20b" --backend hip "${prec[@]}" -m getp --no-progress)
  mkdir -p "$req"
  logged serving-bench python3 scripts/bench_requests.py --mix sharegpt --count "${SERVING_COUNT:-1000}" \
    --out "$req/sharegpt.jsonl"
  logged serving-bench python3 scripts/bench_requests.py --mix prefill-heavy --count "${PREFILL_COUNT:-128}" \
    --out "$req/prefill-heavy.jsonl"
  logged serving-bench python3 scripts/bench_requests.py --mix decode-heavy --count "${SERVING_COUNT:-256}" \
    --out "$req/decode-heavy.jsonl"
  logged serving-bench "${run[@]}" -i "$req/sharegpt.jsonl" -o "$req/out-sharegpt.txt"
  logged serving-bench "${run[@]}" -i "$req/prefill-heavy.jsonl" -o "$req/out-prefill-heavy.txt" --context 4224
  logged serving-bench "${run[@]}" -i "$req/decode-heavy.jsonl" -o "$req/out-decode-heavy.txt"
  grep -E "^bench_requests|^run: limits|^run: [0-9]" "$LOG_DIR/serving-bench.log"
}

# Where the kernels behind the bf16 targets stall (Nsight Compute, one launch each, the profiler's
# locked clocks): the warpgroup expert tiles at a 4,096-row prefill step (mlp1), the 16-pair
# expert tiles at 64 decoding rows (mlp1) and the MMA attention at batch 1 (a full-attention layer
# of a decode step); the full reports in LOG_DIR/stalls-*.txt.
step_stalls() {
  command -v ncu >/dev/null || { echo "stalls: no ncu here"; return 0; }
  [ -f "$MODELS_DIR/20b/config.json" ] || logged stalls "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  local req="$LOG_DIR/requests" run=("$bin/run" "$MODELS_DIR/20b" --backend hip "${prec[@]}" -m getp --no-progress)
  mkdir -p "$req"
  make_requests 64 20 400 "$req/mixed-64.txt"
  make_requests 16 1600 1700 "$req/long-16.txt"
  head -n 1 "$req/mixed-64.txt" >"$req/mixed-1.txt"
  local sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
    --section SchedulerStats --section MemoryWorkloadAnalysis --print-details all)
  # name, kernel regex, launches skipped (mlp1 of layer 13 of the second step; mlp1 of the ninth
  # decode step; layer 1 of the twentieth), the run's arguments
  local cases=("wgmma-prefill|moe_wgmma|26|-i $req/long-16.txt -n 1 --max-batch 16 --step-tokens 4096 --context 4096"
    "wide-decode-64|moe_mma_wide|400|-i $req/mixed-64.txt -n 32 --max-batch 64 --step-tokens 2048 --context 4096"
    "attention-batch-1|attention_mma|481|-i $req/mixed-1.txt -n 32 --max-batch 1 --context 4096")
  local c name regex skip args
  for c in "${cases[@]}"; do
    IFS='|' read -r name regex skip args <<<"$c"
    set +e
    # shellcheck disable=SC2086
    timeout 240 ncu --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 "${sections[@]}" \
      "${run[@]}" $args -o "$req/out-stalls.txt" >"$LOG_DIR/stalls-$name.txt" 2>&1
    echo "== $name: ncu exit $?" | tee -a "$LOG_DIR/stalls.log"
    set -e
    grep -E "Duration|Grid Size|Registers Per|Achieved Occ|Issued Warp Per|Stall [A-Z]|Compute \(SM\) Th|DRAM Th" \
      "$LOG_DIR/stalls-$name.txt" | sort -u | grep -v " 0$\| 0.00$" | tee -a "$LOG_DIR/stalls.log"
  done
}

# The tree against itself with each of AB_PATCHES applied (patch -p1 files, relative to the
# repository root; each tree under AB_DIR, default exp/<patch name>), built side by side (run,
# parity-bench, parity-synth) and run in turn, AB_ROUNDS rounds (default 2), on the synthetic 20b:
# batch-1 decode in both precisions (parity-bench), one request and 64 requests (bf16), 4 requests
# at batch 2 (fp32: the experts' pair mode), and with AB_SERVING=N the ShareGPT-shaped mix of N
# requests and 128 prefill-heavy ones (bf16; scripts/bench_requests.py); then which trees' tokens
# differ from the tree's, and the kernels of a batch-1 decode step of each tree under ncu
# (LOG_DIR/ab-<tree>.csv, summed by scripts/kernel_profile.py). Speed only: a patch that wins is
# then applied and checked by the tests and sanitize steps.
step_ab() {
  [ -n "${AB_PATCHES:-}" ] || { echo "ab: AB_PATCHES names no patch"; return 1; }
  local root trees=(base) dirs=(.) p name
  root="$(pwd)"
  for p in $AB_PATCHES; do
    name="$(basename "$p" .patch)"
    rm -rf "${AB_DIR:-exp}/$name" && mkdir -p "${AB_DIR:-exp}/$name"
    tar --exclude=./exp --exclude="./${AB_DIR:-exp}" --exclude='./build*' --exclude=./device-logs -cf - . |
      tar -xf - -C "${AB_DIR:-exp}/$name"
    (cd "${AB_DIR:-exp}/$name" && patch -p1 -s <"$root/$p") || { echo "ab: $p does not apply"; return 1; }
    trees+=("$name") dirs+=("${AB_DIR:-exp}/$name")
  done
  local arch_flag=-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" jobs=$((JOBS / ${#trees[@]})) i
  [ "$jobs" -ge 1 ] || jobs=1
  for i in "${!trees[@]}"; do
    (cd "${dirs[$i]}" && cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU="$GPU" \
      -DPARITY_WERROR=ON "$arch_flag" >/dev/null &&
      cmake --build "$BUILD_DIR" -j"$jobs" --target run parity-bench parity-synth) >"$LOG_DIR/ab-build-${trees[$i]}.log" 2>&1 &
  done
  local failed=0
  for i in "${!trees[@]}"; do wait -n || failed=1; done
  [ "$failed" = 0 ] || { echo "ab: a build failed"; tail -n 30 "$LOG_DIR"/ab-build-*.log; return 1; }
  [ -f "$MODELS_DIR/20b/config.json" ] || logged ab "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  local req="$LOG_DIR/requests" round b
  mkdir -p "$req"
  make_requests 64 20 400 "$req/mixed-64.txt"
  head -n 1 "$req/mixed-64.txt" >"$req/mixed-1.txt"
  head -n 4 "$req/mixed-64.txt" >"$req/mixed-4.txt"
  local mixes=() m
  if [ -n "${AB_SERVING:-}" ]; then
    python3 scripts/bench_requests.py --mix sharegpt --count "$AB_SERVING" --out "$req/sharegpt.jsonl"
    python3 scripts/bench_requests.py --mix prefill-heavy --count 128 --out "$req/prefill-heavy.jsonl"
    mixes=(sharegpt prefill-heavy)
  fi
  for round in $(seq "${AB_ROUNDS:-2}"); do
    for i in "${!trees[@]}"; do
      b="${dirs[$i]}/$BUILD_DIR/bin"
      for p in bf16 fp32; do
        echo "== ${trees[$i]} $p batch 1, round $round" >>"$LOG_DIR/ab.log"
        "$b/parity-bench" --model 20b --models-dir "$MODELS_DIR" --backend hip --precision "$p" \
          --positions 128 --warmup 16 -q >>"$LOG_DIR/ab.log" 2>&1
      done
      [ "$round" = 1 ] || continue
      local run=("$b/run" "$MODELS_DIR/20b" --backend hip -m getp --no-progress)
      echo "== ${trees[$i]} bf16 1 request, 256 tokens" >>"$LOG_DIR/ab.log"
      "${run[@]}" --precision bf16 -i "$req/mixed-1.txt" -o "$req/${trees[$i]}-1.txt" -n 256 \
        --max-batch 1 >>"$LOG_DIR/ab.log" 2>&1
      echo "== ${trees[$i]} bf16 64 requests, 128 tokens" >>"$LOG_DIR/ab.log"
      "${run[@]}" --precision bf16 -i "$req/mixed-64.txt" -o "$req/${trees[$i]}-64.txt" -n 128 \
        --max-batch 64 --step-tokens 2048 --context 4096 >>"$LOG_DIR/ab.log" 2>&1
      echo "== ${trees[$i]} fp32 4 requests at batch 2, 64 tokens" >>"$LOG_DIR/ab.log"
      "${run[@]}" --precision fp32 -i "$req/mixed-4.txt" -o "$req/${trees[$i]}-4.txt" -n 64 \
        --max-batch 2 >>"$LOG_DIR/ab.log" 2>&1
      for m in "${mixes[@]}"; do
        echo "== ${trees[$i]} bf16 $m" >>"$LOG_DIR/ab.log"
        "${run[@]}" --precision bf16 -i "$req/$m.jsonl" -o "$req/${trees[$i]}-$m.txt" \
          --context 4224 >>"$LOG_DIR/ab.log" 2>&1
      done
    done
  done
  for i in "${!trees[@]}"; do
    [ "$i" = 0 ] && continue
    for n in 1 64 4 "${mixes[@]}"; do
      cmp -s "$req/base-$n.txt" "$req/${trees[$i]}-$n.txt" ||
        echo "ab: ${trees[$i]}'s tokens differ from the tree's ($n requests)" | tee -a "$LOG_DIR/ab.log"
    done
  done
  if command -v ncu >/dev/null; then
    local metrics=gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,launch__grid_size
    metrics+=,launch__registers_per_thread
    for i in "${!trees[@]}"; do
      # shellcheck disable=SC2086
      PARITY_DEVICE_GRAPHS=0 timeout 300 ncu --clock-control none --csv --print-units base --metrics "$metrics" \
        "${dirs[$i]}/$BUILD_DIR/bin/run" "$MODELS_DIR/20b" --backend hip --precision bf16 -m getp --no-progress \
        -i "$req/mixed-1.txt" -o "$req/ncu-out.txt" -n 3 --max-batch 1 >"$LOG_DIR/ab-${trees[$i]}.csv" 2>/dev/null || true
      python3 scripts/kernel_profile.py "$LOG_DIR/ab-${trees[$i]}.csv" >"$LOG_DIR/ab-${trees[$i]}-step.txt" 2>&1 || true
      echo "== ${trees[$i]}: $(head -n 1 "$LOG_DIR/ab-${trees[$i]}-step.txt")" >>"$LOG_DIR/ab.log"
    done
  fi
  grep -E "^== |^median|^run: [0-9]|^ab:" "$LOG_DIR/ab.log"
}

# Every kernel of a few decode steps under Nsight Compute with a handful of metrics (its duration
# without launch gaps, DRAM and L2 bytes, instructions issued, grid, registers), graphs off so
# that each launch is its own: one request, and 64 requests, each through its prefill and
# PROFILE_STEPS (default 4) generated tokens; LOG_DIR/profile-<case>.csv (ncu's raw CSV, a row
# per kernel and metric), which scripts/kernel_profile.py sums by kernel for one step. Also the
# machine code of the expert and projection kernels (LOG_DIR/sass-moe.txt.gz).
step_profile() {
  command -v ncu >/dev/null || { echo "profile: no ncu here"; return 0; }
  [ -f "$MODELS_DIR/20b/config.json" ] || logged profile "$bin/parity-synth" --preset 20b "${synth_tokenizer[@]}" --out "$MODELS_DIR/20b"
  local req="$LOG_DIR/requests" run=("$bin/run" "$MODELS_DIR/20b" --backend hip "${prec[@]}" -m getp --no-progress)
  mkdir -p "$req"
  make_requests 64 20 100 "$req/short-64.txt"  # prefill in a few steps, then 64-row decode steps
  head -n 1 "$req/short-64.txt" >"$req/short-1.txt"
  local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
  metrics+=,smsp__inst_executed.sum,launch__grid_size,launch__registers_per_thread
  local cases=("batch-1|-i $req/short-1.txt --max-batch 1" "batch-64|-i $req/short-64.txt --max-batch 64")
  local c name args
  for c in "${cases[@]}"; do
    IFS='|' read -r name args <<<"$c"
    set +e
    # shellcheck disable=SC2086
    PARITY_DEVICE_GRAPHS=0 timeout 420 ncu --clock-control none --csv --print-units base \
      --metrics "$metrics" "${run[@]}" $args -n "${PROFILE_STEPS:-4}" --step-tokens 2048 --context 4096 \
      -o "$req/out-profile.txt" >"$LOG_DIR/profile-$name.csv" 2>"$LOG_DIR/profile-$name.err"
    echo "== profile $name: ncu exit $?, $(grep -c gpu__time_duration "$LOG_DIR/profile-$name.csv") kernels" |
      tee -a "$LOG_DIR/profile.log"
    set -e
  done
  if command -v cuobjdump >/dev/null; then
    cuobjdump -sass "$bin/run" 2>/dev/null | awk '/Function : /{keep = ($0 ~ /moe_mma|moe_wgmma|bf16w_mma|bf16w_wgmma/)} keep' |
      gzip -9 >"$LOG_DIR/sass-moe.txt.gz" || true
  fi
}

for s in "${steps[@]}"; do
  case "$s" in
    build | tests | sanitize | tiny | hf | 20b | 20b-real | replay-cost | bench | engine | engine-bench | \
      hf-generate | engine-gpus | hf-capture | long-pos | precision-bench | serving-bench | \
      tensor-parallel | stalls | profile | ab) "step_$s" ;;
    *) echo "unknown step $s (build tests sanitize tiny hf 20b 20b-real replay-cost bench engine"\
         "engine-bench hf-generate engine-gpus hf-capture long-pos precision-bench serving-bench"\
         "tensor-parallel stalls profile ab)"; exit 2 ;;
  esac
done
