#!/usr/bin/env bash
# make bench-7b: synth mistral-7b in bf16 (14.5 GB of weights) through
# `cacheprune generate --dtype bf16`: load, a 512-token prefill and 32 decode
# tokens, under /usr/bin/time -v for the peak RSS (the target:
# <= 16 GB, so a 7B model runs on a 24 GB machine).  Not part of make bench.
#
#   profiling/bench_7b.sh [BUILD_DIR]
#
# Needs ~18 GB of available memory (checked first: it refuses rather than
# push a shared machine into the OOM killer) and ~15 GB of disk; the synth
# model is deleted afterwards unless CP_KEEP_7B=1.
set -euo pipefail
B=${1:-build}
M=$B/synth-mistral-7b
out=$B/bench-7b
mkdir -p "$out"
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
need_kb=$((18 * 1024 * 1024))
if [ ! -f "$M/config.json" ] && [ "$avail_kb" -lt "$need_kb" ]; then
    echo "bench-7b: refused: $((avail_kb / 1048576)) GB available, 18 GB needed (try again when the machine is quieter)" >&2
    exit 1
fi
[ -f "$M/config.json" ] || "$B"/cacheprune synth --shape mistral-7b --out "$M" --quiet-progress
ids=$(seq 0 511 | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 7919) % 32000 }')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
OMP_NUM_THREADS=${CP_BENCH_THREADS:-2} /usr/bin/time -v "$B"/cacheprune generate --model "$M" --dtype bf16 --prompt-ids "$ids" \
    -n 33 --ignore-eos --chunk 512 --json --quiet-progress > "$out/generate.json" 2> "$out/time.txt"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
[ "${CP_KEEP_7B:-0}" = 1 ] || rm -rf "$M"
rss_kb=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$out/time.txt")
field() { sed "s/.*\"$1\":\([0-9.e+-]*\).*/\1/" "$out/generate.json"; }
prefill_ms=$(field prefill_ms)
cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/.*: //')
{
    echo "== bench-7b: synth mistral-7b, --dtype bf16 ($cpu, ${CP_BENCH_THREADS:-2} threads)"
    echo "   load average before / after: $load_before / $load_after"
    printf "peak RSS            %8.2f GB (target <= 16 GB)\n" "$(echo "$rss_kb / 1048576" | bc -l)"
    printf "prefill 512 tokens  %8.1f tok/s (%.1f s)\n" "$(echo "512000 / $prefill_ms" | bc -l)" "$(echo "$prefill_ms / 1000" | bc -l)"
    printf "decode              %8.2f tok/s (32 steps at context 512..544)\n" "$(field decode_tok_s)"
    grep -E "Elapsed|Maximum resident" "$out/time.txt" | sed 's/^\s*/   /'
    echo "   matmul path: $(sed 's/.*"matmul":"\([^"]*\)".*/\1/' "$out/generate.json")"
} | tee "$out/summary.txt"
[ "$rss_kb" -le $((16 * 1024 * 1024)) ] || { echo "bench-7b: peak RSS above 16 GB" >&2; exit 1; }
