#!/bin/sh
# Batch invariance end to end, per compute path: `run --concurrency 8`
# against `--concurrency 1` on the first 48 rag-v1 requests, --sharing none,
# cp-books-6m: how many result texts are equal, each run's wall and CPU
# seconds (user + system: on a shared machine the wall time is mostly the
# neighbours'), and the ratios c1 / c8.  Several binaries compare a
# baseline in the same run (they interleave path by path, so load drifts
# hit them alike).  PATHS="name ENV=V [args]|..." picks the paths.
#
# usage: profiling/bench_invariance.sh OUTDIR [BIN ...]
set -eu
OUT=${1:?usage: profiling/bench_invariance.sh OUTDIR [BIN ...]}
shift
[ $# -gt 0 ] || set -- build/cacheprune
BINS="$*"
SHARED=${CP_SHARED:-../shared}
M=$SHARED/models/cp-books-6m
mkdir -p "$OUT"
R=$OUT/rag48.jsonl
"$1" workload --preset rag-v1 --requests 48 --data "$SHARED" --out "$R" --quiet-progress >/dev/null
same() { # equal "text" fields line by line of two result files
    python3 -c 'import json,sys
a=[json.loads(l) for l in open(sys.argv[1])]; b={x["line"]: x["text"] for x in map(json.loads, open(sys.argv[2]))}
print(sum(1 for x in a if b.get(x["line"]) == x["text"]), len(a))' "$1" "$2"
}
secs() { # "wall cpu" seconds of one run
    s=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$OUT/time.txt" "$@" >/dev/null 2>&1
    e=$(date +%s.%N)
    echo "$(echo "$e - $s" | bc) $(awk '{print $1 + $2}' "$OUT/time.txt")"
}
PATHS=${PATHS:-"bf16-amx CP_CPU_ISA=amx|bf16-avx512bf16 CP_CPU_ISA=avx512bf16|bf16-avx512 CP_CPU_ISA=avx512|bf16-avx2 CP_CPU_ISA=avx2|f32 X=1 --dtype f32|f32-prescott OPENBLAS_CORETYPE=Prescott --dtype f32|int8 X=1 --dtype int8|int8-avx2 CP_CPU_ISA=avx2 --dtype int8"}
printf '%-16s %-36s %7s %7s %7s %7s %6s %6s %s\n' path binary c1_wall c8_wall c1_cpu c8_cpu wall cpu "equal"
echo "$PATHS" | tr '|' '\n' | while read -r name envv args; do
    for bin in $BINS; do
        tag=$(echo "$bin" | tr '/' '_')
        t1=$(secs env "$envv" "$bin" run --model "$M" --requests "$R" --sharing none --concurrency 1 --out "$OUT/$name-$tag-c1.jsonl" $args)
        t8=$(secs env "$envv" "$bin" run --model "$M" --requests "$R" --sharing none --concurrency 8 --out "$OUT/$name-$tag-c8.jsonl" $args)
        eq=$(same "$OUT/$name-$tag-c1.jsonl" "$OUT/$name-$tag-c8.jsonl")
        set -- $t1 $t8
        printf '%-16s %-36s %7.1f %7.1f %7.1f %7.1f %6.2f %6.2f %s\n' "$name" "$bin" "$1" "$3" "$2" "$4" "$(echo "$1 / $3" | bc -l)" \
            "$(echo "$2 / $4" | bc -l)" "$(echo "$eq" | tr ' ' /)"
    done
done
