#!/usr/bin/env bash
# Pool capacity with bf16 KV (the target: "segments held per GB doubled,
# hit rate on rag-v1 under a tight --pool-bytes reported for both"): the
# first N rag-v1 requests through build/pool_trace for each
# budget (8 MiB, 32 MiB), each eviction mode (tail blocks, the default; whole
# segments, --whole-eviction) and each KV dtype, interleaved in one run.
# Prints, per budget and mode: bytes held at the end, segments and tokens
# held per MB of the budget, the hit rate, and the ratio bf16 / f32 of tokens
# and segments held (the target: 2.00).  Hit rates do not depend on timing
# (one request at a time, greedy), so the machine's load does not move them.
#
# usage: profiling/pool_capacity.sh [BUILD] [MODEL] [REQUESTS.jsonl] [N]
#   BUILD     build directory with pool_trace and cacheprune (build)
#   MODEL     ../shared/models/cp-books-6m
#   REQUESTS  a rag-v1 log (default: made with `cacheprune workload --preset rag-v1`)
#   N         requests (60)
set -u -o pipefail
BUILD=${1:-build}
MODEL=${2:-../shared/models/cp-books-6m}
REQ=${3:-}
N=${4:-60}
[ -x "$BUILD/pool_trace" ] || { echo "pool_capacity: no $BUILD/pool_trace (make $BUILD/pool_trace)" >&2; exit 2; }
[ -d "$MODEL" ] || { echo "pool_capacity: no model at $MODEL: skipped" >&2; exit 0; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pool-capacity.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT
if [ -z "$REQ" ]; then
    REQ=$TMP/rag-v1.jsonl
    "$BUILD/cacheprune" workload --preset rag-v1 --out "$REQ" --quiet-progress > /dev/null || exit 2
fi
OUT=$TMP/summary
: > "$OUT"
for pb in 8388608 33554432; do
    for ev in tail whole; do
        for kv in f32 bf16; do
            flag=""
            [ "$ev" = whole ] && flag=--whole-eviction
            OMP_NUM_THREADS=1 "$BUILD/pool_trace" --model "$MODEL" --requests "$REQ" --n "$N" --pool-bytes "$pb" --kv-dtype "$kv" \
                $flag --quiet | grep '^summary ' >> "$OUT" || { echo "pool_capacity: pool_trace failed ($pb $ev $kv)" >&2; exit 1; }
        done
    done
done
echo "pool capacity, first $N requests of $(basename "$REQ"), $(uptime | sed 's/.*load/load/')"
awk '
function val(k,   i, a) { for (i = 2; i <= NF; i++) { split($i, a, "="); if (a[1] == k) return a[2] } return "" }
{
    key = val("budget_bytes") " " val("eviction") " " val("kv")
    held[key] = val("held_bytes"); seg[key] = val("segments_per_mb"); tok[key] = val("tokens_per_mb"); hit[key] = val("hit_rate")
    tr[key] = val("truncations"); ev[key] = val("evictions")
    if (!(val("budget_bytes") in seen)) { seen[val("budget_bytes")] = 1; order[++nb] = val("budget_bytes") }
}
END {
    printf "%9s %6s %5s %10s %7s %9s %9s %8s %6s %6s\n", "budget", "evict", "kv", "held MB", "held %", "segs/MB", "tokens/MB", "hit %", "evict", "trunc"
    for (b = 1; b <= nb; b++)
        for (e = 1; e <= 2; e++)
            for (d = 1; d <= 2; d++) {
                k = order[b] " " (e == 1 ? "tail" : "whole") " " (d == 1 ? "f32" : "bf16")
                printf "%8.0fM %6s %5s %10.2f %6.1f%% %9.2f %9.1f %7.1f%% %6d %6d\n", order[b] / 1048576, (e == 1 ? "tail" : "whole"),
                       (d == 1 ? "f32" : "bf16"), held[k] / 1048576, 100 * held[k] / order[b], seg[k], tok[k], 100 * hit[k], ev[k], tr[k]
            }
    for (b = 1; b <= nb; b++)
        for (e = 1; e <= 2; e++) {
            m = (e == 1 ? "tail" : "whole"); f = order[b] " " m " f32"; h = order[b] " " m " bf16"
            printf "ratio bf16/f32, %.0fM, %s eviction: tokens held per MB %.2fx, segments %.2fx (target 2.00x); hit rate %.1f%% vs %.1f%%\n",
                   order[b] / 1048576, m, (tok[f] > 0 ? tok[h] / tok[f] : 0), (seg[f] > 0 ? seg[h] / seg[f] : 0), 100 * hit[h], 100 * hit[f]
        }
}' "$OUT"
