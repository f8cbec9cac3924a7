#!/usr/bin/env bash
# make bench's dtype part: bench_forward on synth qwen2.5-0.5b once per
# weight dtype, each in its own process (so each peak RSS is that dtype's),
# then the forced oneDNN path (CP_CPU_ISA=amx: bf16 compute; on a CPU
# without AMX oneDNN runs it on AVX-512-BF16), and a summary: the CPU, the
# path each run chose, and the bf16 / f32 ratios (target: peak RSS <= 0.6x).
#
#   profiling/bench_dtype.sh [BUILD_DIR] [MODEL_DIR]
set -euo pipefail
B=${1:-build}
M=${2:-build/synth-qwen2.5-0.5b}
out=$B/bench-dtype
mkdir -p "$out"
"$B"/bench_forward --dir "$M" --dtype f32 | tee "$out/f32.txt"
"$B"/bench_forward --dir "$M" --dtype bf16 | tee "$out/bf16.txt"
CP_CPU_ISA=amx "$B"/bench_forward --dir "$M" --dtype bf16 | tee "$out/bf16-onednn.txt"
first() { grep -m1 "^$2" "$out/$1.txt" | sed "s|^$2 *|| | awk '{ print $1 }'; }
echo
echo "== dtype summary ($(grep -m1 '^CPU:' "$out/f32.txt" | sed 's/^CPU: //'))"
printf "%-14s %10s %10s %12s %12s  %s\n" run "prefill" "decode" "peak RSS MB" "RSS / f32" "matmul path"
r32=$(first f32 "peak RSS MB (load + prefill + decode)")
for r in f32 bf16 bf16-onednn; do
    rss=$(first $r "peak RSS MB (load + prefill + decode)")
    printf "%-14s %10s %10s %12s %11.2fx  %s\n" $r "$(first $r 'prefill tok/s')" "$(first $r 'decode tok/s at context')" "$rss" \
        "$(echo "$rss / $r32" | bc -l)" "$(grep -m1 '^matmul path:' "$out/$r.txt" | sed 's/^matmul path: //')"
done
echo "(prefill: 1024-token tok/s; decode: tok/s at 1k context; GEMM ceilings in each file under $out)"
