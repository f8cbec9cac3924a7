#!/usr/bin/env python3
"""One tenant's latency while another floods the server (serve under a hostile tenant).

usage: profiling/hostile_tenant.py CACHEPRUNE MODEL MODE DELAY THREADS [CACHEPRUNE2 ...]

Starts `CACHEPRUNE serve` on MODEL (a fresh server per binary, default options), measures
bob's 64-token greedy chat request alone (best of 3), then again 4 times while THREADS
threads of alice send a ~1.8 KB prompt of capitalised names (costly to detect) with
max_tokens 1, back to back:
  MODE ff    -- alice closes her socket DELAY seconds after sending (0: at once), never
                reading the answer: the request is abandoned;
  MODE kept  -- alice reads each answer (DELAY unused): an ordinary flood.
Prints one line per binary: bob alone, bob under the flood (seconds each), how many requests
alice sent and the engine's job counters from /metrics.  Run several binaries in one call to
compare them on the same machine and load.  Python 3 standard library only.
"""
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BOB = "sk-bob-0123456789abcdefgh"
ALICE = "sk-alice-0123456789abcdef"
OPERATOR = "sk-op-0123456789abcdefghij"


def serve(binary, model, keys):
    p = subprocess.Popen([binary, "serve", "--model", model, "--keys", keys, "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("listening on"):
            port = int(line.strip().rsplit(":", 1)[1])
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
            return p, port
    p.wait()
    sys.exit(f"{binary}: the server did not start")


def bob(port):
    body = json.dumps({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 64,
                       "temperature": 0}).encode()
    rq = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                {"Authorization": "Bearer " + BOB, "Content-Type": "application/json"})
    t = time.time()
    urllib.request.urlopen(rq).read()
    return time.time() - t


def alice(port, mode, delay, stop, sent):
    while not stop.is_set():
        body = json.dumps({"messages": [{"role": "user", "content": "Anna Berg Carl Dahl Emil Frost " * 60
                                         + str(random.random())}], "max_tokens": 1})
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode())
            if mode == "ff":
                if delay:
                    time.sleep(delay)
            else:
                while s.recv(65536):
                    pass
            s.close()
        except OSError:
            pass
        sent[0] += 1
        time.sleep(0.01)


def metrics(port):
    rq = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer " + OPERATOR})
    text = urllib.request.urlopen(rq).read().decode()
    keep = ("cacheprune_engine_jobs_total", "cacheprune_cancelled_total")
    return " ".join(l.replace("cacheprune_", "") for l in text.splitlines() if l.startswith(keep))


def main():
    if len(sys.argv) < 6 or sys.argv[3] not in ("ff", "kept"):
        sys.exit(__doc__)
    model, mode, delay, threads = sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
    with tempfile.TemporaryDirectory() as d:
        keys = os.path.join(d, "keys")
        with open(keys, "w") as f:
            f.write(f"{ALICE} alice\n{BOB} bob\n{OPERATOR} op operator\n")
        os.chmod(keys, 0o600)
        for binary in [sys.argv[1]] + sys.argv[6:]:
            p, port = serve(binary, model, keys)
            try:
                alone = min(bob(port) for _ in range(3))
                stop, sent = threading.Event(), [0]
                ts = [threading.Thread(target=alice, args=(port, mode, delay, stop, sent), daemon=True) for _ in range(threads)]
                for t in ts:
                    t.start()
                time.sleep(1.0)
                flood = [bob(port) for _ in range(4)]
                stop.set()
                for t in ts:
                    t.join()
                print(f"{binary}: {mode} delay {delay} s x {threads}: bob alone {alone:.2f} s, under the flood "
                      + " ".join(f"{x:.2f}" for x in flood) + f" s; alice sent {sent[0]}; {metrics(port)}", flush=True)
            finally:
                p.terminate()
                p.wait()


if __name__ == "__main__":
    main()
