#!/usr/bin/env python3
"""How many more user/assistant-turn tokens the free-text recognizer marks
sensitive (the sharing cost of names): for each request log given, every
user and assistant message goes through `cacheprune detect --json --model M`
with and without --no-names, and the masked tokens are summed.

usage: profiling/names_mask_cost.py [--bin build/cacheprune] [--model DIR] LOG.jsonl...
(the logs from `cacheprune workload --preset rag-v1|chat-v1|meetings-v1`)."""
import argparse, json, subprocess, sys

def mask(bin_, model, text, role, extra):
    r = subprocess.run([bin_, "detect", "--json", "--model", model, "--role", role] + extra + ["-"],
                       input=text.encode(), capture_output=True, check=True)
    j = json.loads(r.stdout)
    m = j.get("mask", [])
    return sum(m), len(m), j["wholly"], [s["type"] for s in j["spans"]]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/cacheprune")
    ap.add_argument("--model", default="../shared/models/cp-books-6m")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    print("%-14s %6s %8s %10s %10s %8s  %s" % ("log", "msgs", "tokens", "masked", "masked+nm", "extra", "new span types"))
    for path in a.logs:
        msgs = tok = base = withn = 0
        types = {}
        seen = set()
        for line in open(path):
            for m in json.loads(line).get("messages", []):
                if m["role"] not in ("user", "assistant"):
                    continue
                key = (m["role"], m["content"])
                if key in seen:  # repeated turns cost the same each time; count each once
                    continue
                seen.add(key)
                b, n, _, _ = mask(a.bin, a.model, m["content"], m["role"], ["--no-names"])
                w, _, _, ty = mask(a.bin, a.model, m["content"], m["role"], [])
                msgs += 1; tok += n; base += b; withn += w
                for t in ty:
                    types[t] = types.get(t, 0) + 1
        print("%-14s %6d %8d %10d %10d %7.1f%%  %s" % (path.split("/")[-1], msgs, tok, base, withn,
              100.0 * (withn - base) / max(tok, 1), " ".join("%s:%d" % kv for kv in sorted(types.items()))))

if __name__ == "__main__":
    sys.exit(main())
