#!/bin/bash
# A tensor-parallel group of two MPI ranks against the same group as threads and one GPU.
exec > >(tee -a $OUT/log) 2>&1
source <(sed -n '/^DEPS_DIR=/,/^fi$/p' scripts/device_check.sh)
source <(sed -n '/^make_requests()/,/^}/p' scripts/device_check.sh)
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c; which mpirun; mpirun --version | head -1
export PARITY_MODELS_DIR=/tmp/parity-models
timeout 300 bash -c 'cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPU=cuda -DPARITY_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build build-device -j32 --target run parity-synth parity_tests 2>&1 | grep -E "error|FAILED" -A5 | head -30; cmake --build build-device -j32 --target run parity-synth parity_tests 2>&1 | tail -1'
grep -c "PARITY_HAVE_MPI" build-device/compile_commands.json
date
timeout 120 build-device/bin/parity_tests --gtest_filter='PeerGroup.*:EngineTensorParallel.ThePeer*' 2>&1 | grep -E "^\[  (PASSED|FAILED) |FAILED|Failure" | head
timeout 100 build-device/bin/parity-synth --preset 20b --tokenizer build-devdeps/o200k_harmony/tokenizer.json --out /tmp/parity-models/20b > /dev/null
mkdir -p /tmp/req; make_requests 16 20 400 /tmp/req/m-16.txt
common=(-m getp --no-progress -i /tmp/req/m-16.txt -n 64 --max-batch 16 --step-tokens 2048 --context 4096 --kv-memory 8G)
mpi=(mpirun --allow-run-as-root -np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
for prec in fp32 bf16; do
  echo "== $prec: one GPU, threads TP2 (nccl), MPI TP2"
  timeout 120 build-device/bin/run /tmp/parity-models/20b --backend hip --precision $prec "${common[@]}" -o /tmp/o-1-$prec.txt 2>&1 | grep -E "^run: 16|error"
  timeout 120 build-device/bin/run /tmp/parity-models/20b --backend hip --precision $prec --tensor-parallel 2 --all-reduce nccl "${common[@]}" -o /tmp/o-t-$prec.txt 2>&1 | grep -E "^run: 16|error"
  timeout 180 "${mpi[@]}" build-device/bin/run /tmp/parity-models/20b --backend hip --precision $prec --tensor-parallel 2 "${common[@]}" -o /tmp/o-m-$prec.txt 2>&1 | grep -E "^run|error|rank" | cut -c1-300
  echo "mpi exit ${PIPESTATUS[0]}"
  cmp /tmp/o-t-$prec.txt /tmp/o-m-$prec.txt && echo "$prec: MPI group = thread group (NCCL), tokens identical"
  cmp /tmp/o-1-$prec.txt /tmp/o-m-$prec.txt && echo "$prec: MPI group = one GPU, tokens identical"
done
echo "== a world the groups do not divide"
timeout 60 mpirun --allow-run-as-root -np 2 -x LD_LIBRARY_PATH build-device/bin/run /tmp/parity-models/20b --backend hip --tensor-parallel 4 "${common[@]}" -o /tmp/o-bad.txt 2>&1 | tail -3; echo "exit ${PIPESTATUS[0]}"
date
