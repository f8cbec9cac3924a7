#!/usr/bin/env bash
# make bench-serve: `cacheprune serve` under load (profiling/bench_serve.c),
# one server per model, started once with --concurrency 24 (the default
# --step-tokens 32, so 16 decoding streams leave 16 tokens a step for a new
# prompt's prefill), --sharing none (speed, not hits):
#   1. client concurrency 1, 4, 16: requests/s, output tokens/s, TTFT and
#      inter-token p50 / p95 (4, 8, 32 requests of MAXTOK tokens);
#   2. inter-token latency of 16 decoding streams, without and with new
#      prompts (ARRIVE_WORDS words each, back to back) arriving meanwhile.
# The ratios (c16 / c1 output tokens/s; ITL p95 with / without arrivals)
# come from this one run; the load average is printed with them (the
# machine is shared, absolute rates move with it).
# The steady streams are STEADY_TOK (128) tokens long: the 16 prompts
# prefill one at a time, so on a loaded machine shorter streams ended before
# the last one began (an empty window).  STEADY_ONLY=1 runs part 2 alone.
# usage: bench_serve.sh CACHEPRUNE BENCH_SERVE OUT_DIR MODEL_DIR...
set -eu -o pipefail
BIN=$1 GEN=$2 OUT=$3
shift 3
# SERVE_ARGS: more serve options, e.g. SERVE_ARGS="--dtype int8"
SERVE_ARGS=${SERVE_ARGS:-}
MAXTOK=${MAXTOK:-32} STEADY_TOK=${STEADY_TOK:-128} STEADY_ONLY=${STEADY_ONLY:-0} ARRIVE_WORDS=${ARRIVE_WORDS:-40}
mkdir -p "$OUT"
KEY=sk-bench-0123456789abcdef
printf '%s bench\n' "$KEY" > "$OUT/keys" && chmod 600 "$OUT/keys"
rate() { sed -E "s/.*$1=([0-9.]+).*/\1/"; }
for MODEL in "$@"; do
  name=$(basename "$MODEL")
  OMP_WAIT_POLICY=passive "$BIN" serve --model "$MODEL" --keys "$OUT/keys" --port 0 --sharing none --concurrency 24 \
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
  declare -A TPS=([1]=0 [4]=0 [16]=0)
  for c in 1 4 16; do
    [ "$STEADY_ONLY" = 1 ] && break
    line=$("$GEN" --port "$port" --key "$KEY" --clients $c --requests $((c == 1 ? 4 : 2 * c)) --max-tokens "$MAXTOK")
    echo "$line"
    TPS[$c]=$(echo "$line" | rate out_tok_per_s)
  done
  quiet=$("$GEN" --port "$port" --key "$KEY" --clients 16 --steady --max-tokens "$STEADY_TOK")
  busy=$("$GEN" --port "$port" --key "$KEY" --clients 16 --steady --max-tokens "$STEADY_TOK" --arrivals "$ARRIVE_WORDS")
  echo "$quiet"
  echo "$busy"
  [ "$STEADY_ONLY" = 1 ] || awk -v a="${TPS[16]}" -v b="${TPS[1]}" -v c="${TPS[4]}" -v q="$(echo "$quiet" | rate itl_p95_ms)" -v w="$(echo "$busy" | rate itl_p95_ms)" \
    -v l="$(cut -d' ' -f1-3 /proc/loadavg)" -v n="$name" 'BEGIN {
      printf "%s: output tokens/s c4 / c1 = %.2fx, c16 / c1 = %.2fx (target >= 6x on the 0.5B shape); ", n, c / b, a / b
      printf "inter-token p95 at c16 with arrivals / without = %.2fx (target <= 2.5x); load average now %s\n", w / q, l }'
  [ "$STEADY_ONLY" = 1 ] && awk -v q="$(echo "$quiet" | rate itl_p95_ms)" -v w="$(echo "$busy" | rate itl_p95_ms)" -v n="$name" \
    -v l="$(cut -d' ' -f1-3 /proc/loadavg)" 'BEGIN { printf "%s: inter-token p95 at c16 with arrivals / without = %.2fx (target <= 2.5x); load average now %s\n", n, w / q, l }'
  kill $pid && wait $pid 2> /dev/null || true
  trap - EXIT
done
