#!/usr/bin/env bash
# A/B of two prof_batch binaries in one run:
#   profiling/ab_prof_batch.sh OLD_BIN NEW_BIN MODEL_DIR [ROUNDS (2)] [prof_batch args...]
# Runs OLD and NEW alternately (ABBA: the order flips each round, so a load that
# rises or falls during the run does not favour one side), ROUNDS times each,
# with passive OpenMP waits (what the binaries choose themselves when the user
# set no policy: kernels/cpu/cpu_runtime.h) and with libgomp's own default
# spinning (GOMP_SPINCOUNT=300000, a policy the binaries leave alone;
# POLICIES="passive" skips that), prints
# the load average, and per policy the median step time of each column (the
# forward view's B=1 / B=16, the batcher's B=1 / B=16 decode steps), calls per
# step, the new/old step-time ratio, and each binary's B=16 vs B=1 tokens/s.
# Timings on a shared machine are noisy: read the ratios, which see the same load.
set -u -o pipefail
[ $# -ge 3 ] || { echo "usage: $0 OLD_BIN NEW_BIN MODEL_DIR [ROUNDS] [prof_batch args...]" >&2; exit 2; }
OLD=$1 NEW=$2 DIR=$3 ROUNDS=${4:-2}
shift $(( $# >= 4 ? 4 : 3 ))
OUT=$(mktemp -d "${TMPDIR:-/tmp}/ab_prof_batch.XXXXXX")
echo "ab_prof_batch: $(uptime)"
POLICIES=${POLICIES:-passive spin}
for pol in $POLICIES; do
    for r in $(seq 1 "$ROUNDS"); do
        order="old new"; [ $((r % 2)) = 0 ] && order="new old"
        for side in $order; do
            bin=$OLD; [ $side = new ] && bin=$NEW
            if [ $pol = passive ]; then OMP_WAIT_POLICY=passive "$bin" --dir "$DIR" "$@" > "$OUT/$pol.$side.$r" 2>&1
            else env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=300000 "$bin" --dir "$DIR" "$@" > "$OUT/$pol.$side.$r" 2>&1; fi || { echo "ab_prof_batch: $bin failed:"; tail -3 "$OUT/$pol.$side.$r"; exit 1; }
        done
    done
done
echo "ab_prof_batch: $(uptime)"
# columns: forward B=1, forward B=B, batcher B=1, batcher B=B (the serial-batcher column skipped)
cols() { # file what(step total|calls per step)
    awk -v what="$2" 'index($0, what) == 1 { n++; sub(what, ""); split($0, f, " ");
        if (n == 1) printf "%s %s ", f[1], f[2]; else if (n == 2) printf "%s %s ", f[1], f[3] }' "$1"; echo
}
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for pol in $POLICIES; do
    echo
    echo "OpenMP waits $pol: median over $ROUNDS rounds, ms per step (calls per step)"
    printf "%-8s %18s %18s %18s %18s\n" side "forward B=1" "forward B=16" "batcher B=1" "batcher B=16"
    declare -A med
    for side in old new; do
        line=$(printf "%-8s" "$side")
        for c in 1 2 3 4; do
            m=$(for f in "$OUT"/$pol.$side.*; do cols "$f" "step total" | awk -v c=$c '{ print $c }'; done | median)
            k=$(cols "$OUT/$pol.$side.1" "calls per step" | awk -v c=$c '{ print $c }')
            med[$side.$c]=$m
            line+=$(printf " %11.2f (%4s)" "$m" "$k")
        done
        echo "$line"
    done
    line=$(printf "%-8s" "new/old")
    for c in 1 2 3 4; do line+=$(awk -v a="${med[new.$c]}" -v b="${med[old.$c]}" 'BEGIN { printf " %17.3fx", a / b }'); done
    echo "$line"
    for side in old new; do
        echo "$side: B=16 vs B=1 tokens/s, forward $(awk -v a="${med[$side.1]}" -v b="${med[$side.2]}" 'BEGIN { printf "%.2fx", 16 * a / b }')," \
             "batcher decode $(awk -v a="${med[$side.3]}" -v b="${med[$side.4]}" 'BEGIN { printf "%.2fx", 16 * a / b }')"
    done
    unset med
done
echo
echo "ab_prof_batch: full outputs in $OUT"
