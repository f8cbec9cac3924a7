"""PyTorch's scaled_dot_product_attention on the shapes bench_cuda times
(Qwen2.5-7B heads: 28 query / 4 KV heads of 128, causal), in bf16 (the
target's comparison) and f32 (what our f32 kernel computes), timed with CUDA
events after warm-up, median of 10.  Run by profiling/gpu_check.sh on the
lent GPU; prints one row per shape."""
import torch
import torch.nn.functional as F


def median_ms(fn, reps=10):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    torch.manual_seed(0)
    heads, kv_heads, d = 28, 4, 128
    print(f"{'SDPA (PyTorch ' + torch.__version__ + ')':<24} {'shape':<30} {'time':>12} {'rate':>17}")
    for n in (4096, 8192):
        for dtype in (torch.bfloat16, torch.float32):
            q = torch.randn(1, heads, n, d, device="cuda", dtype=dtype)
            k = torch.randn(1, kv_heads, n, d, device="cuda", dtype=dtype)
            v = torch.randn(1, kv_heads, n, d, device="cuda", dtype=dtype)
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
            flops = 4.0 * d * heads * n * (n + 1) / 2
            name = "sdpa " + str(dtype).replace("torch.", "")
            print(f"{name:<24} {str(n) + ' causal, 28/4 x 128':<30} {ms:9.3f} ms {flops / ms / 1e9:9.1f} TFLOP/s")


if __name__ == "__main__":
    main()
