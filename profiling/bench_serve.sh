#!/usr/bin/env bash
# make bench-serve: `cacheprune serve` under load (profiling/bench_serve.c),
# one server per model, started once with --concurrency 24 and the default
# --step-tokens / --prefill-tokens, --sharing none (speed, not hits):
#   1. client concurrency 1, 4, 16 over the same REQUESTS (16) requests —
#      request i's prompt is the same in every phase, each MAXTOK (128)
#      output tokens, a chat-length answer: requests/s, output tokens/s,
#      TTFT and inter-token p50 / p95, what the phase held (requests, prompt
#      and output tokens) and where the engine thread's time went (forward
#      steps with their prefill / decode tokens, the rest of each step,
#      taking jobs, idle);
#   2. inter-token latency of 16 decoding streams, without and with new
#      prompts (ARRIVE_WORDS words each, back to back) arriving meanwhile.
# The ratios come from this one run: output tokens/s c16 / c1 (the target:
# >= 6x on the 0.5B shape), steady decode (16 streams decoding alone,
# 16 / their ITL p50, against one stream's 1 / ITL p50 at c1) and ITL p95
# with / without arrivals; the load average is printed with them (the
# machine may be shared, absolute rates move with it).
# The steady streams are STEADY_TOK (128) tokens long.  STEADY_ONLY=1 runs
# part 2 alone.  PROMPT_WORDS (4): each prompt's "the X of N" phrases.
# usage: bench_serve.sh CACHEPRUNE BENCH_SERVE OUT_DIR MODEL_DIR...
set -eu -o pipefail
BIN=$1 GEN=$2 OUT=$3
shift 3
# SERVE_ARGS: more serve options, e.g. SERVE_ARGS="--dtype int8"
SERVE_ARGS=${SERVE_ARGS:-}
MAXTOK=${MAXTOK:-128} REQUESTS=${REQUESTS:-16} STEADY_TOK=${STEADY_TOK:-128} STEADY_ONLY=${STEADY_ONLY:-0} ARRIVE_WORDS=${ARRIVE_WORDS:-40}
PROMPT_WORDS=${PROMPT_WORDS:-4}
mkdir -p "$OUT"
KEY=sk-bench-0123456789abcdef
printf '%s bench operator\n' "$KEY" > "$OUT/keys" # operator: the bench reads /metrics && chmod 600 "$OUT/keys"
rate() { head -1 | sed -E "s/.*$1=([0-9.]+).*/\1/"; }
for MODEL in "$@"; do
  name=$(basename "$MODEL")
  "$BIN" serve --model "$MODEL" --keys "$OUT/keys" --port 0 --sharing none --concurrency 24 \
    --max-tokens-cap 1000 $SERVE_ARGS > "$OUT/$name.serve.out" 2> "$OUT/$name.serve.err" &
  pid=$!
  port=
  for _ in $(seq 600); do
    port=$(sed -nE 's/^listening on 127\.0\.0\.1:([0-9]+)$/\1/p' "$OUT/$name.serve.out")
    [ -n "$port" ] && break
    kill -0 $pid 2> /dev/null || { cat "$OUT/$name.serve.err" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { echo "bench-serve: serve did not start" >&2; kill $pid; exit 1; }
  trap 'kill $pid 2> /dev/null' EXIT
  echo "== $name (load average at start: $(cut -d' ' -f1-3 /proc/loadavg))"
  "$GEN" --port "$port" --key "$KEY" --clients 1 --requests 1 --max-tokens 4 > /dev/null # warm-up
  declare -A TPS=([1]=0 [4]=0 [16]=0) ITL=([1]=0)
  for c in 1 4 16; do
    [ "$STEADY_ONLY" = 1 ] && break
    line=$("$GEN" --port "$port" --key "$KEY" --clients $c --requests "$REQUESTS" --max-tokens "$MAXTOK" --words "$PROMPT_WORDS")
    echo "$line"
    TPS[$c]=$(echo "$line" | rate out_tok_per_s)
    ITL[$c]=$(echo "$line" | rate itl_p50_ms)
  done
  quiet=$("$GEN" --port "$port" --key "$KEY" --clients 16 --steady --max-tokens "$STEADY_TOK")
  busy=$("$GEN" --port "$port" --key "$KEY" --clients 16 --steady --max-tokens "$STEADY_TOK" --arrivals "$ARRIVE_WORDS")
  echo "$quiet"
  echo "$busy"
  [ "$STEADY_ONLY" = 1 ] || awk -v a="${TPS[16]}" -v b="${TPS[1]}" -v c="${TPS[4]}" -v q="$(echo "$quiet" | rate itl_p95_ms)" -v w="$(echo "$busy" | rate itl_p95_ms)" \
    -v i1="${ITL[1]}" -v i16="$(echo "$quiet" | rate itl_p50_ms)" -v l="$(cut -d' ' -f1-3 /proc/loadavg)" -v n="$name" -v r="$REQUESTS" -v t="$MAXTOK" 'BEGIN {
      printf "%s: the same %d requests of %d output tokens at every concurrency: output tokens/s c4 / c1 = %.2fx, c16 / c1 = %.2fx (target >= 6x on the 0.5B shape); ", n, r, t, c / b, a / b
      printf "steady decode, 16 streams alone vs one (16 / ITL p50 %.1f ms vs 1 / %.1f ms) = %.2fx; ", i16, i1, (i16 > 0 ? 16 * i1 / i16 : 0)
      printf "inter-token p95 at c16 with arrivals / without = %.2fx (target <= 2.5x); load average now %s\n", w / q, l }'
  [ "$STEADY_ONLY" = 1 ] && awk -v q="$(echo "$quiet" | rate itl_p95_ms)" -v w="$(echo "$busy" | rate itl_p95_ms)" -v n="$name" \
    -v l="$(cut -d' ' -f1-3 /proc/loadavg)" 'BEGIN { printf "%s: inter-token p95 at c16 with arrivals / without = %.2fx (target <= 2.5x); load average now %s\n", n, w / q, l }'
  kill $pid && wait $pid 2> /dev/null || true
  trap - EXIT
done
