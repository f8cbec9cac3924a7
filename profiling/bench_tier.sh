#!/usr/bin/env bash
# make bench-tier: the shared tier on Redis (README "Shared tier on Redis").
#   1. fetch + place from the tier against recomputing, per 1k prompt tokens,
#      on each MODEL: a long document stored by one `run` process, then asked
#      by another tenant in a second process (its fill time, from the tier's
#      figures) and by a third with no sharing (its TTFT: the recompute)
#   2. rag-v1 split between two replicas (odd / even lines): hit rate when
#      they share one Redis against two isolated replicas (no tier)
# usage: bench_tier.sh CACHEPRUNE OUTDIR RAG_MODEL MODEL... ; N=lines of rag-v1 (150)
set -euo pipefail
BIN=$1 OUT=$2 RAG_MODEL=$3
shift 3
N=${N:-150}
command -v redis-server > /dev/null || { echo "bench-tier: redis-server is not installed (.ci/deps)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
exec > >(tee "$OUT/table.txt") # the table, also in OUTDIR/table.txt
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 16380)
(cd "$OUT" && exec redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --maxmemory-policy volatile-lru \
    --logfile redis.log) &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null || true' EXIT
for i in $(seq 100); do redis-cli -p "$PORT" ping > /dev/null 2>&1 && break; sleep 0.05; done
openssl rand -hex 32 > "$OUT/tier.key" && chmod 600 "$OUT/tier.key"
TIER="--tier redis://127.0.0.1:$PORT --tier-key-file $OUT/tier.key"
flush() { redis-cli -p "$PORT" flushall > /dev/null; }
field() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" "$1" | head -1; }

# ---- 1. fetch + place vs recompute ----
DOC=$(python3 - <<'PY' 2>/dev/null || true
import json, glob
t = open(sorted(glob.glob("../shared/data/gutenberg/pg84_*.txt"))[0], encoding="utf-8", errors="replace").read()
print(json.dumps(t[30000:33200].replace("\r", " ")))  # ~800 tokens: within cp-books-6m's 1024
PY
)
[ -n "$DOC" ] || { echo "bench-tier: needs python3 and the kit's Gutenberg text" >&2; exit 1; }
printf '%-36s %8s %10s %12s %12s %8s\n' model prompt tier_hit fill_ms/1k recompute_ms/1k ratio
for M in "$@"; do
    flush
    for who in alice bob; do
        printf '{"tenant":"%s","max_tokens":1,"messages":[{"role":"document","content":%s},{"role":"user","content":"Summarise."}]}\n' \
            "$who" "$DOC" > "$OUT/one-$who.jsonl"
    done
    "$BIN" run --quiet-progress --model "$M" --requests "$OUT/one-alice.jsonl" $TIER > /dev/null 2>&1
    "$BIN" run --quiet-progress --report-reuse --model "$M" --requests "$OUT/one-bob.jsonl" $TIER --out "$OUT/tier.out" \
        > /dev/null 2> "$OUT/tier.err"
    "$BIN" run --quiet-progress --model "$M" --requests "$OUT/one-bob.jsonl" --sharing none --out "$OUT/none.out" > /dev/null 2>&1
    P=$(field "$OUT/tier.out" prompt_tokens) R=$(field "$OUT/tier.out" reused) C=$(field "$OUT/tier.out" recomputed)
    FILL=$(sed -n 's/.* \([0-9.]*\) ms per lookup.*/\1/p' "$OUT/tier.err" | tail -1)
    TN=$(field "$OUT/none.out" ttft_ms)
    [ -n "$P" ] && [ -n "$TN" ] && [ -n "$FILL" ] || { echo "bench-tier: a run failed on $M (see $OUT/tier.out, $OUT/none.out)" >&2; exit 1; }
    H=$((R + C))
    python3 -c "h=$H; p=$P; f=$FILL; t=$TN
print('%-36s %8d %10d %12.2f %12.2f %7.1fx' % ('$(basename "$M")', p, h, f/h*1000 if h else 0, t/p*1000, (t/p)/(f/h) if h and f else 0))"
done

# ---- 2. rag-v1 split between two replicas ----
"$BIN" workload --preset rag-v1 --seed 1 --out "$OUT/rag-v1.jsonl" > /dev/null
head -n "$N" "$OUT/rag-v1.jsonl" | awk 'NR % 2 == 1' > "$OUT/half-a.jsonl"
head -n "$N" "$OUT/rag-v1.jsonl" | awk 'NR % 2 == 0' > "$OUT/half-b.jsonl"
hit() { sed -n 's/.*"hit_rate":[[:space:]]*\([0-9.e-]*\).*/\1/p' "$1" | head -1; }
for setup in isolated shared; do
    flush
    extra=""
    [ $setup = shared ] && extra=$TIER
    for h in a b; do
        "$BIN" run --quiet-progress --model "$RAG_MODEL" --requests "$OUT/half-$h.jsonl" $extra --summary-json "$OUT/$setup-$h.json" \
            > /dev/null 2>&1
    done
    printf 'rag-v1 (%d requests) %-9s replica A hit rate %s, replica B hit rate %s\n' "$N" "$setup" "$(hit "$OUT/$setup-a.json")" \
        "$(hit "$OUT/$setup-b.json")"
done
