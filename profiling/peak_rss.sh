#!/usr/bin/env bash
# Peak resident memory of one long request through `cacheprune run`
# (cacheprune sharing: the prefill's attention export and the annotator),
# measured with /usr/bin/time -v.  A benchmark, not a test: minutes on a
# laptop for 16k tokens of a 0.5B model.
#
#   profiling/peak_rss.sh [BIN] [MODEL] [TOKENS]
#     BIN     the cacheprune binary (build/cacheprune)
#     MODEL   a model directory (build/synth-qwen2.5-0.5b: made with
#             `cacheprune synth --shape qwen2.5-0.5b --out build/synth-qwen2.5-0.5b` when absent)
#     TOKENS  the prompt's length in tokens (16384 less the template's few)
# Prints the prompt's token count and "peak RSS: N KiB".
set -euo pipefail
BIN=${1:-build/cacheprune}
MODEL=${2:-build/synth-qwen2.5-0.5b}
TOKENS=${3:-16384}
if [ ! -d "$MODEL" ]; then "$BIN" synth --shape qwen2.5-0.5b --out "$MODEL"; fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cp-rss.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# words of a small alphabet: the synth tokenizer is byte-level, one token a
# byte; leave room for the chat template's tokens
python3 - "$TMP/req.jsonl" "$TOKENS" <<'PY'
import json, random, sys
random.seed(1)
words = "the a of river stone garden lamp quiet morning letter window bridge winter harbor silver market".split()
n = int(sys.argv[2]) - 44
text = ""
while len(text) < n:
    text += random.choice(words) + " "
open(sys.argv[1], "w").write(json.dumps({"tenant": "t1", "prompt": text[:n], "max_tokens": 1}) + "\n")
PY
/usr/bin/time -v "$BIN" run --model "$MODEL" --requests "$TMP/req.jsonl" --sharing cacheprune --out "$TMP/out.jsonl" \
    --quiet-progress > "$TMP/log" 2> "$TMP/time" || { cat "$TMP/log" "$TMP/time" >&2; exit 1; }
python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print("prompt tokens:", r.get("prompt_tokens"), "| error:", r.get("error"))' "$TMP/out.jsonl"
grep -E "Maximum resident set size|Elapsed" "$TMP/time" | sed 's/^\s*//'
