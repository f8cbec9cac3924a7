#!/usr/bin/env bash
# The device check, run once per lent GPU session (see the device tool's
# README): build with CUDA=1, run the CUDA tests (which compare against the
# CPU backend), run the kernel microbenchmarks, print a short table.
# Budget: well under 10 minutes on an H200 machine.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
status=0
if ! make -j16 CUDA=1 build/cuda/cp_tests build/cuda/bench_cuda > "$out/build.log" 2>&1; then
    echo "BUILD FAILED"; tail -30 "$out/build.log"; exit 1
fi
make cuda-regs > /dev/null 2>&1 && cp profiling/cuda_regs.txt "$out/" 2>/dev/null
CP_TMP=build/cuda/tmp ./build/cuda/cp_tests --filter 'cuda/*' --verbose > "$out/tests.log" 2>&1 || status=1
./build/cuda/bench_cuda > "$out/bench.txt" 2>&1 || status=1
echo "== CUDA tests"; grep -E '^\[(PASS|FAIL|SKIP)|Synthesis' "$out/tests.log"
echo "== kernels";    cat "$out/bench.txt"
exit $status
