#!/usr/bin/env bash
# make bench's reuse part (the goal: reuse must keep paying when GEMMs get
# fast): the rag-v1 plans of cp-books-6m under the default setting (`run`
# with no sharing option: in-context segments, this model's automatic
# calibration) replayed on synth qwen2.5-0.5b by prof_reuse -- the last
# CP_REUSE_LAST (40) of the first CP_REUSE_REQUESTS (150) requests, a warm
# pool -- in f32, in bf16 on the automatic path (the AMX tiles, the
# vdpbf16ps kernels on AVX512_BF16, else f32 compute from the bf16
# weights), and in bf16 with a bf16 KV cache; each prints the speedup over a
# full prefill, the compute ceiling (prompt / computed tokens), their ratio
# (target: >= 75 % in bf16) and the per-stage breakdown of a reuse prefill.
#
#   profiling/bench_reuse.sh [BUILD_DIR] [MODEL_DIR]
#
# The plans: $CP_REUSE_PLANS if set, else made here with cp-books-6m (the
# kit's; skipped with a note without it).
set -euo pipefail
B=${1:-build}
M=${2:-build/synth-qwen2.5-0.5b}
SHARED=${CP_SHARED:-../shared}
N=${CP_REUSE_REQUESTS:-150}
LAST=${CP_REUSE_LAST:-40}
out=$B/bench-reuse
mkdir -p "$out"
plans=${CP_REUSE_PLANS:-}
if [ -z "$plans" ]; then
    if [ ! -d "$SHARED/models/cp-books-6m" ]; then
        echo "bench_reuse: no cp-books-6m at $SHARED (the plans are its decisions): skipped"
        exit 0
    fi
    plans=$out/plan$N-default.jsonl
    if [ ! -s "$plans" ] || [ "$(wc -l < "$plans")" -lt "$N" ] || [ "$B"/cacheprune -nt "$plans" ]; then
        echo "bench_reuse: making the default setting's plans of the first $N rag-v1 requests on cp-books-6m ..."
        "$B"/cacheprune workload --preset rag-v1 --seed 1 --out "$out/rag-v1.jsonl" > /dev/null
        head -n "$N" "$out/rag-v1.jsonl" > "$out/rag-v1-$N.jsonl"
        "$B"/cacheprune run --quiet-progress --model "$SHARED/models/cp-books-6m" --requests "$out/rag-v1-$N.jsonl" \
            --plan-out "$plans.tmp" > /dev/null
        mv "$plans.tmp" "$plans"
    fi
fi
run() { # name, env..., then prof_reuse's options
    local name=$1; shift
    env "$@" "$B"/prof_reuse --dir "$M" --plans "$plans" --last "$LAST" $REUSE_OPTS | tee "$out/$name.txt"
}
# bf16 through oneDNN where the CPU has AMX or AVX-512-BF16; else the
# automatic path's own bf16 kernels (bf16 weights, f32 compute: AVX2 CPUs)
bf=bf16
REUSE_OPTS="--dtype f32"; run f32
REUSE_OPTS="--dtype bf16"; run $bf
REUSE_OPTS="--dtype bf16 --kv-dtype bf16"; run $bf-kv16
echo
echo "== reuse prefill: the rag-v1 default-setting replay (last $LAST of $N requests) on $(basename "$M"), load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-18s %9s %9s %12s %14s\n" run speedup ceiling "of ceiling" "CPU-time ratio"
for r in f32 $bf $bf-kv16; do
    f=$out/$r.txt
    sp=$(grep -m1 'speedup' "$f" | sed 's/.*speedup \([0-9.]*\)x.*/\1/')
    ce=$(grep -m1 'ceiling [0-9.]*x' "$f" | sed 's/.*ceiling \([0-9.]*\)x.*/\1/')
    pc=$(grep -m1 '^reuse of ceiling' "$f" | awk '{ print $4 }')
    cp=$(grep -m1 'process CPU time' "$f" | sed 's/.*, \([0-9.]*\) % of the ceiling/\1/')
    printf "%-18s %8sx %8sx %10s %% %12s %%\n" "$r" "$sp" "$ce" "$pc" "$cp"
done
echo "(target: the bf16 replay >= 75 % of its ceiling; the stages of each in $out/*.txt)"
