#!/usr/bin/env bash
# make bench-f32: the f32 GEMM providers (bench_f32_gemm.c) under each
# OpenBLAS kernel set this CPU runs -- Prescott (what Debian's OpenBLAS
# 0.3.21 falls back to on a CPU it does not know), Haswell, SkylakeX -- and
# as the binary chooses with no variable set, ROUNDS rounds interleaved,
# the load average before and after.  Read the ratios within a round.
#   profiling/bench_f32_gemm.sh [BUILD_DIR] [ROUNDS (2)]
set -u -o pipefail
B=${1:-build}
ROUNDS=${2:-2}
echo "bench_f32_gemm: $(uptime)"
for r in $(seq 1 "$ROUNDS"); do
    for core in Prescott Haswell SkylakeX chosen; do
        if [ $core = chosen ]; then env -u OPENBLAS_CORETYPE "$B"/bench_f32_gemm ${ROWS:+--rows $ROWS} | head -1 | sed 's/^/[as chosen] /'
        else OPENBLAS_CORETYPE=$core "$B"/bench_f32_gemm ${ROWS:+--rows $ROWS} | head -1; fi
    done
done
echo "bench_f32_gemm: $(uptime)"
