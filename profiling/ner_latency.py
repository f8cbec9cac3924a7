#!/usr/bin/env python3
"""Per-message latency of the NER plugin (plugins/ner/ner.mjs, protocol v2):
one persistent process, each text sent as a request line and timed to its
reply line.  Texts: Presidio's sentences (--data), and the user/assistant
turns of request logs given (cacheprune workload --preset ...).

usage: profiling/ner_latency.py [--dir plugins/ner] [--data FILE] [LOG.jsonl...]"""
import argparse, json, subprocess, sys, time

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100.0 * len(v)))]

def run(dirname, texts, label):
    p = subprocess.Popen(["node", dirname + "/ner.mjs"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    t0 = time.perf_counter()
    p.stdin.write(b'{"id":0,"text":"","role":"user"}\n'); p.stdin.flush(); p.stdout.readline()
    start = time.perf_counter() - t0
    lat, nbytes = [], 0
    for i, t in enumerate(texts, 1):
        line = json.dumps({"id": i, "text": t, "role": "user"}).encode() + b"\n"
        a = time.perf_counter()
        p.stdin.write(line); p.stdin.flush()
        r = json.loads(p.stdout.readline())
        lat.append((time.perf_counter() - a) * 1000)
        assert r.get("id") == i, r
        nbytes += len(t.encode())
    p.stdin.close(); p.wait()
    print("%-14s %5d msgs, %7.0f B/msg mean: p50 %6.2f ms  p95 %6.2f ms  max %7.2f ms  (start %.2f s)" %
          (label, len(texts), nbytes / max(len(texts), 1), pct(lat, 50), pct(lat, 95), max(lat), start))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="plugins/ner")
    ap.add_argument("--data", default="../shared/data/presidio-synth-pii/synth_dataset_v2.json")
    ap.add_argument("logs", nargs="*")
    a = ap.parse_args()
    run(a.dir, [x["full_text"] for x in json.load(open(a.data))], "presidio")
    for path in a.logs:
        seen, texts = set(), []
        for line in open(path):
            for m in json.loads(line).get("messages", []):
                if m["role"] in ("user", "assistant") and m["content"] not in seen:
                    seen.add(m["content"]); texts.append(m["content"])
        run(a.dir, texts, path.split("/")[-1])

if __name__ == "__main__":
    sys.exit(main())
