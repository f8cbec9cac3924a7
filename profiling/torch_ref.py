#!/usr/bin/env python3
"""Eager PyTorch on the same synth weights (an optional second
reference beside llama.cpp).  A plain Qwen2 / Llama forward written with
torch ops (RMSNorm, q/k/v with biases, rotate-half RoPE, GQA attention with
a KV cache, SwiGLU, tied or untied head), the weights read straight from the
model's safetensors (no safetensors or transformers package needed).  Times
a prefill of --tokens ids and --decode steps after it, in f32 and in bf16
(weights and activations bf16, as torch's CPU bf16 matmuls run them), and
prints ours beside it from make bench's bench_dtype files when they exist.

    python3 profiling/torch_ref.py MODEL_DIR [--tokens 1024] [--decode 16]
        [--threads 2] [--ours build/bench-dtype] [--check-ids 1,2,3]

--check-ids: greedy 16 ids after that prompt in f32, printed (to compare
with `cacheprune generate --prompt-ids ... --dtype f32`; --spellable N
limits the argmax to ids below N, as our sampler keeps to the ids its
tokenizer can spell: 258 on synth tiny).  Without torch it
prints one line and exits 0.  Not in .ci/deps: optional, like llama.cpp.
"""
import json
import math
import os
import struct
import sys
import time

try:
    import torch
except ImportError:
    print("torch_ref: no torch for this python (Debian: apt-get install python3-torch): skipped")
    sys.exit(0)


def load(model_dir, dtype):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors = {}
    names = [n for n in sorted(os.listdir(model_dir)) if n.endswith(".safetensors")]
    tmap = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    for n in names:
        with open(os.path.join(model_dir, n), "rb") as f:
            hl = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(hl))
            data = bytearray(f.read())
        for k, v in header.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            t = torch.frombuffer(data[a:b], dtype=tmap[v["dtype"]]).reshape(v["shape"])
            tensors[k] = t.to(dtype).contiguous()
    return cfg, tensors


class Model:
    def __init__(self, cfg, w, dtype):
        self.c, self.w, self.dt = cfg, w, dtype
        self.L = cfg["num_hidden_layers"]
        self.H = cfg["num_attention_heads"]
        self.KV = cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim", cfg["hidden_size"] // self.H)
        self.eps = cfg["rms_norm_eps"]
        half = self.hd // 2
        self.inv = torch.tensor([cfg.get("rope_theta", 10000.0) ** (-2.0 * i / self.hd) for i in range(half)], dtype=torch.float64)
        self.head = w.get("lm_head.weight", w["model.embed_tokens.weight"])

    def rms(self, x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(self.dt) * g

    def rope(self, x, pos):  # x [T, heads, hd]
        ang = pos.double()[:, None] * self.inv[None, :]
        c, s = torch.cos(ang).float().to(self.dt)[:, None, :], torch.sin(ang).float().to(self.dt)[:, None, :]
        a, b = x[..., : self.hd // 2], x[..., self.hd // 2 :]
        return torch.cat([a * c - b * s, b * c + a * s], -1)

    def lin(self, x, name):
        y = x @ self.w[name + ".weight"].t()
        b = self.w.get(name + ".bias")
        return y + b if b is not None else y

    def forward(self, ids, cache, start):
        w, T = self.w, len(ids)
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        pos = torch.arange(start, start + T)
        g = self.H // self.KV
        for l in range(self.L):
            p = "model.layers.%d." % l
            h = self.rms(x, w[p + "input_layernorm.weight"])
            q = self.rope(self.lin(h, p + "self_attn.q_proj").view(T, self.H, self.hd), pos)
            k = self.rope(self.lin(h, p + "self_attn.k_proj").view(T, self.KV, self.hd), pos)
            v = self.lin(h, p + "self_attn.v_proj").view(T, self.KV, self.hd)
            if cache[l] is None:
                cache[l] = (k, v)
            else:
                cache[l] = (torch.cat([cache[l][0], k]), torch.cat([cache[l][1], v]))
            K, V = cache[l]
            n = K.shape[0]
            qh = q.transpose(0, 1)  # [H, T, hd]
            Kh = K.transpose(0, 1).repeat_interleave(g, 0)  # [H, n, hd]
            Vh = V.transpose(0, 1).repeat_interleave(g, 0)
            s = (qh @ Kh.transpose(1, 2)).float() / math.sqrt(self.hd)
            mask = torch.arange(n)[None, :] > (pos[:, None])  # causal by position
            s = s.masked_fill(mask[None], float("-inf"))
            att = (torch.softmax(s, -1).to(self.dt) @ Vh).transpose(0, 1).reshape(T, self.H * self.hd)
            x = x + self.lin(att, p + "self_attn.o_proj")
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            x = x + self.lin(torch.nn.functional.silu(self.lin(h, p + "mlp.gate_proj")) * self.lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
        last = self.rms(x[-1:], w["model.norm.weight"])
        return (last @ self.head.t()).float()[0]


def bench(model_dir, dtype, T, D):
    cfg, w = load(model_dir, dtype)
    m = Model(cfg, w, dtype)
    ids = [(i * 7919) % 20000 % cfg["vocab_size"] for i in range(T)]  # bench_forward's ids
    with torch.no_grad():
        m.forward(ids[:16], [None] * m.L, 0)  # warm-up
        cache = [None] * m.L
        t0 = time.perf_counter()
        m.forward(ids, cache, 0)
        tp = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(D):
            m.forward([1], cache, T + i)
        td = (time.perf_counter() - t0) / D
    return T / tp, 1 / td


def greedy(model_dir, ids, n, spellable):
    cfg, w = load(model_dir, torch.float32)
    m = Model(cfg, w, torch.float32)
    out, cache = [], [None] * m.L
    with torch.no_grad():
        lg = m.forward(ids, cache, 0)
        for i in range(n):
            out.append(int(torch.argmax(lg[:spellable])))  # as our sampler: only ids the tokenizer can spell
            lg = m.forward([out[-1]], cache, len(ids) + i)
    return out


def ours(path, name):
    try:
        with open(os.path.join(path, name + ".txt")) as f:
            txt = f.read()
    except OSError:
        return None
    def first(key):
        for line in txt.splitlines():
            if line.startswith(key):
                return float(line[len(key):].split()[0])
        return None
    return first("prefill tok/s"), first("decode tok/s at context")


def main():
    a = sys.argv[1:]
    if not a or a[0].startswith("-"):
        print(__doc__)
        return 2
    model_dir, opts = a[0], dict(zip(a[1::2], a[2::2]))
    T, D = int(opts.get("--tokens", 1024)), int(opts.get("--decode", 16))
    torch.set_num_threads(int(opts.get("--threads", 2)))
    if "--check-ids" in opts:
        ids = [int(x) for x in opts["--check-ids"].split(",")]
        n_ok = int(opts.get("--spellable", 1 << 30))
        print("torch f32 greedy:", ",".join(str(i) for i in greedy(model_dir, ids, 16, n_ok)))
        return 0
    print("eager PyTorch %s (%d threads) on %s: prefill %d tokens, %d decode steps after it" % (torch.__version__, torch.get_num_threads(), model_dir, T, D))
    rows = []
    for name, dt, our in (("f32", torch.float32, "f32"), ("bf16", torch.bfloat16, "bf16-onednn")):
        p, d = bench(model_dir, dt, T, D)
        o = ours(opts.get("--ours", "build/bench-dtype"), our)
        rows.append((name, p, d, o))
        print("  torch %-5s prefill %8.1f tok/s  decode %6.2f tok/s" % (name, p, d) +
              ("   ours (%s) %8.1f / %6.2f: prefill %.2fx, decode %.2fx" % (our, o[0], o[1], o[0] / p, o[1] / d) if o and None not in o else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
