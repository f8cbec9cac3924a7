#!/usr/bin/env bash
# Peak resident memory of one long request through the engine, sharing
# cacheprune (the prefill's attention export and the annotator):
# profiling/peak_rss.c under /usr/bin/time -v.  A benchmark, not a test:
# about 6 CPU-minutes for 16k tokens of synth qwen2.5-0.5b.
#
#   profiling/peak_rss.sh [MODEL] [TOKENS]
#     MODEL   default build/synth-qwen2.5-0.5b (made with `cacheprune synth
#             --shape qwen2.5-0.5b` when absent; its context is 32768)
#     TOKENS  default 16384 (the prompt's length, template included)
#
# Measured 2026-12-01 (2 shared cores, OMP_NUM_THREADS=1, 16 341 prompt
# tokens, synth qwen2.5-0.5b): peak RSS 4 930 560 KiB before (c070fe8: dense
# T x T export, KV for 32 768 slots), 3 427 028 KiB after (band, KV grown to
# 16 342 slots): -1.43 GiB.
set -euo pipefail
MODEL=${1:-build/synth-qwen2.5-0.5b}
TOKENS=${2:-16384}
BLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
make -s build/cacheprune build/obj/profiling/peak_rss.o
cc -fopenmp build/obj/profiling/peak_rss.o build/libcacheprune.a -o build/peak_rss -L$BLAS -Wl,-rpath,$BLAS -lopenblas -ldnnl -lcjson \
    -lpcre2-8 -lutf8proc -lmicrohttpd -lcrypto -lpthread -ldl -lm
if [ ! -d "$MODEL" ]; then build/cacheprune synth --shape qwen2.5-0.5b --out "$MODEL"; fi
/usr/bin/time -v build/peak_rss "$MODEL" "$TOKENS" 2> build/peak_rss.time
grep -E "Maximum resident set size|Elapsed" build/peak_rss.time | sed 's/^\s*//'
