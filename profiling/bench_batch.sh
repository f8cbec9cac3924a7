#!/usr/bin/env bash
# make bench-batch, part 2: output tokens/s of `run --concurrency N` at
# N = 1, 4, 16 on one model, in one run (the ratios to N = 1 are the result;
# absolute rates depend on the machine and its load).  The log is 16 short
# prompts, each generating 16 tokens (ignore_eos is not a run option: a
# random-weight synth model rarely emits its EOS early), so decoding —
# weight-bandwidth bound, where batching pays — dominates.
# usage: bench_batch.sh CACHEPRUNE MODEL_DIR OUT_DIR
set -eu -o pipefail
BIN=$1 MODEL=$2 OUT=$3
mkdir -p "$OUT"
LOG=$OUT/short16.jsonl
: > "$LOG"
for i in $(seq 0 15); do
  printf '{"tenant":"t%d","prompt":"Request %d: tell me about the harbour, the mill and the ferry of town %d.","max_tokens":16}\n' \
    $((i % 4)) "$i" "$i" >> "$LOG"
done
declare -A RATE
for c in 1 4 16; do
  line=$("$BIN" run --quiet-progress --model "$MODEL" --requests "$LOG" --sharing none \
           --concurrency "$c" --step-tokens $((c + 32)) | grep '^batched:')
  echo "$line"
  RATE[$c]=$(echo "$line" | sed -E 's/.* = ([0-9.]+) output tokens\/s/\1/')
done
for c in 4 16; do
  awk -v a="${RATE[$c]}" -v b="${RATE[1]}" -v c="$c" 'BEGIN { printf "concurrency %d: %.2fx the output tokens/s of concurrency 1\n", c, a / b }'
done
