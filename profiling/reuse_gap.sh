#!/usr/bin/env bash
# make reuse-gap: what each reuse rule of cacheprune costs in hit rate and
# tokens computed, beside 16-token chunks, on cp-books-6m.  Per workload
# (rag-v1's first 60 requests, chat-v1 and meetings-v1 whole), one row each:
#   chunk16        --sharing chunk --chunk-size 16 (the fixed-chunk baseline)
#   default        cacheprune with every default
#   then cacheprune with one rule switched off alone:
#   tau0           --tau 0           the annotator's self-containment test (optional)
#   minlen16       --min-len 16      segments as short as the shortest lookup window (optional)
#   maxrec         --recompute 0     the recompute ratio (costs tokens computed, never hit rate; optional)
#   pool4g         --pool-bytes 4G   the KV budget (optional)
#   maskpad0       --mask-pad 0      the padding around sensitive spans (privacy)
#   rowlimit1      --row-limit 1     the per-row sensitive-attention bound (privacy)
#   beta1          --beta 1          the per-segment sensitive-attention bound (privacy)
#   nodetect       --no-names --no-ner  the free-text recognizers, false positives included (privacy)
#   budget-off     --row-limit 1 --beta 1  the whole sensitive-attention budget (privacy)
#   optional-off   every optional one above off together
# and, for scale, the privacy-first way to share more text after a secret:
#   canonical      --segment-kv canonical  segments computed from their own message alone
# Each row runs `run --compare none,MODE` so its quality (greedy agreement
# with full recompute, KL) and TTFT ratio come from the same run as its
# baseline.  Hit rate and token counts are deterministic; TTFT ratios are
# same-run ratios and noisy on a busy machine.
#
#   profiling/reuse_gap.sh [BUILD_DIR] [MODEL_DIR]
#
# CP_GAP_WORKLOADS ("rag-v1:60 chat-v1:150 meetings-v1:150") and
# CP_GAP_ROWS (every row) pick a subset; CP_GAP_EXTRA adds options to every
# cacheprune row before its own (e.g. to try a candidate default); CP_GAP_OUT
# (BUILD_DIR/reuse-gap) is where the logs, summaries and table.tsv go.
set -euo pipefail
B=${1:-build}
SHARED=${CP_SHARED:-../shared}
M=${2:-$SHARED/models/cp-books-6m}
WORKLOADS=${CP_GAP_WORKLOADS:-rag-v1:60 chat-v1:150 meetings-v1:150}
ROWS=${CP_GAP_ROWS:-chunk16 default tau0 minlen16 maxrec pool4g maskpad0 rowlimit1 beta1 nodetect budget-off optional-off canonical}
EXTRA=${CP_GAP_EXTRA:-}
out=${CP_GAP_OUT:-$B/reuse-gap}
mkdir -p "$out"
if [ ! -d "$M" ]; then
    echo "reuse_gap: no model at $M (the kit's cp-books-6m): skipped"
    exit 0
fi

# the options of a row (its mode first)
row_opts() {
    case $1 in
    chunk16) echo "chunk --chunk-size 16" ;;
    default) echo "cacheprune" ;;
    tau0) echo "cacheprune --tau 0" ;;
    minlen16) echo "cacheprune --min-len 16" ;;
    maxrec) echo "cacheprune --recompute 0" ;;
    pool4g) echo "cacheprune --pool-bytes 4G" ;;
    maskpad0) echo "cacheprune --mask-pad 0" ;;
    rowlimit1) echo "cacheprune --row-limit 1" ;;
    beta1) echo "cacheprune --beta 1" ;;
    nodetect) echo "cacheprune --no-names --no-ner" ;;
    budget-off) echo "cacheprune --row-limit 1 --beta 1" ;;
    canonical) echo "cacheprune --segment-kv canonical" ;;
    optional-off) echo "cacheprune --tau 0 --min-len 16 --recompute 0 --pool-bytes 4G" ;;
    *) echo "reuse_gap: unknown row $1" >&2; return 1 ;;
    esac
}

table=$out/table.tsv
printf 'workload\trow\tkind\thit_rate\tcomputed\tprompt\tgreedy\tkl\tttft_p50_vs_none\n' > "$table"
for w in $WORKLOADS; do
    preset=${w%%:*} n=${w##*:}
    log=$out/$preset-$n.jsonl
    if [ ! -s "$log" ]; then
        "$B"/cacheprune workload --preset "$preset" --seed 1 --data "$SHARED" --out "$out/$preset.jsonl" --quiet-progress > /dev/null
        head -n "$n" "$out/$preset.jsonl" > "$log.tmp"
        mv "$log.tmp" "$log"
    fi
    for r in $ROWS; do
        set -- $(row_opts "$r")
        mode=$1
        shift
        extra=
        [ "$mode" = cacheprune ] && extra=$EXTRA
        sum=$out/$preset-$n-$r.json
        # shellcheck disable=SC2086
        "$B"/cacheprune run --quiet-progress --model "$M" --requests "$log" --compare "none,$mode" $extra "$@" \
            --summary-json "$sum" > /dev/null 2> "$out/$preset-$n-$r.err" || {
            echo "reuse_gap: $preset $r failed (see $out/$preset-$n-$r.err)" >&2
            exit 1
        }
        kind=optional
        case $r in chunk16 | default) kind=- ;; maskpad0 | rowlimit1 | beta1 | nodetect | budget-off) kind=privacy ;; canonical) kind=mode ;; esac
        python3 - "$sum" "$mode" "$preset:$n" "$r" "$kind" >> "$table" << 'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
m = next(x for x in d["modes"] if x["mode"] == sys.argv[2])
print("\t".join([sys.argv[3], sys.argv[4], sys.argv[5], "%.1f%%" % (100 * m["hit_rate"]), str(m["computed_tokens"]),
                 str(m["prompt_tokens"]), "%.1f%%" % (100 * m["greedy_agreement"]), "%.4f" % m["kl"],
                 "%.2fx" % m["ratio_p50_vs_none"]]))
EOF
        tail -n 1 "$table" >&2
    done
done
column -t -s $'\t' "$table"
