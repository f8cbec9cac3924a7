#!/usr/bin/env bash
# The device check, run once on each lent GPU machine (the device tool's
# README): that machine has the CUDA toolkit and libc but no apt, none of our
# Debian libraries and no ../shared.  So this builds, with nvcc and gcc alone,
#   gpu_check    per-op parity with the CPU reference ops (compiled from our
#                own C without BLAS) and the carried weight packs end to end
#   bench_cuda   the kernel microbenchmarks against ceilings measured in the
#                same run (a device-to-device copy, a large cuBLASLt GEMM)
# then runs both and, when PyTorch is there, SDPA on the attention shapes.
# Prepare here first: `make gpu-carry` (the packs, into build/gpu_carry),
# then run it through the device tool with carry ["build/gpu_carry"].
# It also builds here (no device: the binaries report SKIP).  Budget: < 4 min.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
packs=${PACKS:-build/gpu_carry}
bin=build/gpu_check_bin
mkdir -p "$out" "$bin"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
"$NVCC" --version | tail -1

# -- build: our C (no BLAS, OpenMP where gcc has it) + the CUDA backend
CFLAGS="-std=c11 -O2 -D_POSIX_C_SOURCE=200809L -DCP_NO_BLAS -DCP_CUDA=1 -Wall -Wextra -Werror -Wno-unknown-pragmas"
echo 'int main(void){return 0;}' > "$bin/omp.c"
gcc -fopenmp "$bin/omp.c" -o "$bin/omp" 2> /dev/null && CFLAGS="$CFLAGS -fopenmp" && OMP=-lgomp || OMP=
C_SRC="kernels/status.c kernels/dtype.c kernels/fileio.c kernels/log.c kernels/cpu/ops_cpu.c kernels/cpu/backend_cpu.c
       kernels/cpu/backend_cpu_matmul.c kernels/cpu/backend_cpu_attn.c
       engine/annotate/sat.c engine/annotate/annotate.c model/forward.c model/forward_batch.c model/forward_layer.c model/model_tensors.c model/pack.c profiling/gpu_checks.c"
CU_SRC="kernels/cuda/backend_cuda.cu kernels/cuda/ops_cuda.cu kernels/cuda/gemm_cuda.cu kernels/cuda/attn_cuda.cu kernels/cuda/attn_mma_cuda.cu
        kernels/cuda/annot_cuda.cu"
NVFLAGS="-std=c++17 -O2 -lineinfo -I$CUDA_HOME/include -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90"
# every object in parallel (the device machine has 16 cores), then the links;
# rpath: the binaries find cuBLASLt where this toolkit keeps it
build() {
    local objs="" pids="" f o
    for f in $C_SRC profiling/gpu_check_main.c; do
        o="$bin/$(basename "${f%.c}").o"; gcc $CFLAGS -c "$f" -o "$o" & pids="$pids $!"
        [ "$f" = profiling/gpu_check_main.c ] || objs="$objs $o"
    done
    for f in $CU_SRC profiling/bench_cuda.cu; do
        o="$bin/$(basename "${f%.cu}").o"; "$NVCC" $NVFLAGS -c "$f" -o "$o" & pids="$pids $!"
        [ "$f" = profiling/bench_cuda.cu ] || objs="$objs $o"
    done
    for p in $pids; do wait "$p" || return 1; done
    local rpath="-Xlinker -rpath -Xlinker $CUDA_HOME/lib64 -Xlinker -rpath -Xlinker $CUDA_HOME/targets/x86_64-linux/lib"
    "$NVCC" -o "$bin/gpu_check" "$bin/gpu_check_main.o" $objs -lcublasLt $OMP -lm $rpath || return 1
    "$NVCC" -o "$bin/bench_cuda" "$bin/bench_cuda.o" $objs -lcublasLt $OMP -lm $rpath || return 1
}
t0=$(date +%s)
if ! build > "$out/build.log" 2>&1; then
    echo "BUILD FAILED"; tail -40 "$out/build.log"; exit 1
fi
echo "built in $(( $(date +%s) - t0 )) s"

status=0
if [ "${1:-}" = "--cpu" ]; then # the harness checked against itself, here
    "$bin/gpu_check" --cpu "$packs"; exit $?
fi
"$bin/gpu_check" "$packs" 2>&1 | tee "$out/check.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
"$bin/bench_cuda" "$packs" 2>&1 | tee "$out/bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if command -v python3 > /dev/null && python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null; then
    python3 profiling/sdpa_bench.py 2>&1 | tee "$out/sdpa.txt"
fi
echo "== summary"
grep -E '^(PASS|FAIL|SKIP)|gpu_check:' "$out/check.txt" | grep -v '^PASS' || true
grep -E 'passed' "$out/check.txt"
exit $status
