#!/usr/bin/env bash
# make bench's dtype part: bench_forward on synth qwen2.5-0.5b once per
# weight dtype, each in its own process (so each peak RSS is that dtype's),
# then the forced oneDNN path (CP_CPU_ISA=amx: bf16 compute; on a CPU
# without AMX oneDNN runs it on AVX-512-BF16), and a summary: the CPU, the
# path each run chose, and the bf16 / f32 ratios (target: peak RSS <= 0.6x);
# then --dtype int8, and decode of each as a share of the stream-read
# bandwidth each run measured (target: >= 70 % for bf16 and int8).
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
"$B"/bench_forward --dir "$M" --dtype int8 | tee "$out/int8.txt"
first() { grep -m1 "^$2" "$out/$1.txt" | sed "s|^$2 *||" | awk '{ print $1 }'; }
echo
echo "== dtype summary ($(grep -m1 '^CPU:' "$out/f32.txt" | sed 's/^CPU: //'))"
printf "%-14s %10s %10s %12s %12s %10s %9s %9s %9s  %s\n" run "prefill" "decode" "peak RSS MB" "RSS / f32" "stream GB/s" "% of bw" "GEMVs %" "rest %" "matmul path"
r32=$(first f32 "peak RSS MB (load + prefill + decode)")
for r in f32 bf16 bf16-onednn int8; do
    rss=$(first $r "peak RSS MB (load + prefill + decode)")
    bw=$(grep -m1 '^decode GB/s vs stream read' "$out/$r.txt" | awk '{ print $7, $8 }')
    gv=$(grep -m1 '^decode GEMVs GB/s vs stream read' "$out/$r.txt" | awk '{ print $9 }')
    rest=$(grep -m1 '^decode ms/token: GEMVs, rest' "$out/$r.txt" | awk '{ print $7 }')
    printf "%-14s %10s %10s %12s %11.2fx %10s %9s %9s %9s  %s\n" $r "$(first $r 'prefill tok/s')" "$(first $r 'decode tok/s at context')" "$rss" \
        "$(echo "$rss / $r32" | bc -l)" "${bw% *}" "${bw#* }" "${gv:-?}" "${rest:-?}" "$(grep -m1 '^matmul path:' "$out/$r.txt" | sed 's/^matmul path: //')"
done
echo "(prefill: 1024-token tok/s; decode: tok/s at 1k context; % of bw: weight bytes a token / decode time over the"
echo " stream-read bandwidth of the same run; GEMVs %: the same for one step's matmuls alone; rest %: the share of a"
echo " decode token outside its matmuls (norms, RoPE, attention at 1k context, the forward's own code);"
echo " GEMM ceilings and the skinny-GEMM table in each file under $out)"
