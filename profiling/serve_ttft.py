#!/usr/bin/env python3
"""Time to first token as a streaming client of `cacheprune serve` sees it,
for two server binaries side by side (a change against its baseline).

    profiling/serve_ttft.py BIN_A BIN_B MODEL_DIR REQUESTS.jsonl [ROUNDS]

Starts `BIN_A serve` and `BIN_B serve` on free loopback ports (one key per
tenant of the log, written to a temporary keys file), then sends the log's
requests (`workload` JSONL: tenant and messages) one at a time to both
servers, alternating which goes first, as streaming chat completions of 4
tokens at temperature 0.  TTFT is from sending the request to the first
chunk that carries text.  Each server keeps its own pool, so both see the
same sequence of hits.  Prints mean and p50 per server and round (the log sent once over), and the
paired difference A - B.  Standard library only.
"""
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, model, keys, port, log):
    p = subprocess.Popen([binary, "serve", "--model", model, "--keys", keys, "--port", str(port)],
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(240):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return p
        except OSError:
            if p.poll() is not None:
                sys.exit(f"serve_ttft: {binary} exited with {p.returncode} (its log: {log.name})")
            time.sleep(0.25)
    p.kill()
    sys.exit(f"serve_ttft: {binary} did not listen on port {port}")


def ttft_ms(port, key, messages):
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 4, "stream": True, "temperature": 0})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"serve_ttft: HTTP {r.status}: {r.read()[:200]!r}")
    first = None
    for line in r:
        if first is None and line.startswith(b"data: {"):
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if delta.get("content"):
                first = time.perf_counter()
        if line.startswith(b"data: [DONE]"):
            break
    c.close()
    if first is None:
        sys.exit("serve_ttft: a stream ended without text")
    return (first - t0) * 1000


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    bin_a, bin_b, model, log_path = sys.argv[1:5]
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    reqs = [json.loads(l) for l in open(log_path) if l.strip()]
    tenants = sorted({r["tenant"] for r in reqs})
    key = {t: f"serve-ttft-key-{i:04d}-abcdefgh" for i, t in enumerate(tenants)}
    with tempfile.TemporaryDirectory() as tmp:
        keys = os.path.join(tmp, "keys")
        with open(keys, "w") as f:
            for t in tenants:
                f.write(f"{key[t]} {t}\n")
        logs = [open(os.path.join(tmp, n), "w") for n in ("a.log", "b.log")]
        ports = [free_port(), free_port()]
        procs = [start(b, model, keys, p, l) for b, p, l in zip((bin_a, bin_b), ports, logs)]
        try:
            for n in range(rounds):
                got = ([], [])
                for i, r in enumerate(reqs):
                    for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                        got[k].append(ttft_ms(ports[k], key[r["tenant"]], r["messages"]))
                d = [a - b for a, b in zip(*got)]
                print(f"round {n + 1} ({len(reqs)} requests): A mean {statistics.mean(got[0]):.2f} p50 {statistics.median(got[0]):.2f} ms;"
                      f" B mean {statistics.mean(got[1]):.2f} p50 {statistics.median(got[1]):.2f} ms;"
                      f" A - B paired mean {statistics.mean(d):.2f} median {statistics.median(d):.2f} ms")
        finally:
            for p in procs:
                p.terminate()
                p.wait()


if __name__ == "__main__":
    main()
