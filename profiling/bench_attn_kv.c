/* Decode attention over a long cache, one query row, the 0.5B shape's heads
 * (14 query heads, 2 KV heads, head_dim 64) by default, over L distinct
 * layers' caches (a token's worth: at 1k context 25 MB in f32, past the
 * L3 with the weights streaming between layers): the general path
 * (cpu_attention_general: two BLAS products a head, one thread, scalar
 * expf) and the decode kernel (cpu_attention_decode,
 * threaded over (row, KV head), AVX-512 where the CPU has it) on an f32
 * cache, and on a bf16 cache read in place.  Calls interleaved, best of R
 * tokens each; ms a token and how many times faster the kernel is.
 *
 * usage: bench_attn_kv [--context C] [--layers L] [--rounds R] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops_cpu.h"
#include "bench_clock.h"
#include "bench_args.h"

int main(int argc, char **argv)
{
    int C = 1024, L = 24, R = 20, H = 14, KV = 2, HD = 64;
    static const char usage[] = "usage: bench_attn_kv [--context C] [--layers L] [--rounds R]\n";
    const int args = bench_args_check(argc, argv);
    if (args) return bench_usage(args, usage);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--context") == 0) C = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--layers") == 0) L = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rounds") == 0) R = atoi(argv[i + 1]);
        else return bench_usage(2, usage);
    }
    if (C < 1 || L < 1 || R < 1) return bench_usage(2, usage);
    const size_t kn = (size_t)C * KV * HD, all = kn * (size_t)L;
    float *q = malloc((size_t)H * HD * 4), *k = malloc(all * 4), *v = malloc(all * 4), *o = malloc((size_t)H * HD * 4);
    uint16_t *k16 = malloc(all * 2), *v16 = malloc(all * 2);
    int32_t *kp = malloc((size_t)C * 4), qp = C - 1;
    if (!q || !k || !v || !o || !k16 || !v16 || !kp) return fprintf(stderr, "bench_attn_kv: out of memory\n"), 1;
    uint32_t r = 1;
    for (int i = 0; i < H * HD; i++) r = r * 1664525u + 1013904223u, q[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < all; i++) {
        r = r * 1664525u + 1013904223u, k[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
        r = r * 1664525u + 1013904223u, v[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
        k16[i] = cp_f32_to_bf16(k[i]), v16[i] = cp_f32_to_bf16(v[i]);
    }
    for (int j = 0; j < C; j++) kp[j] = j;
    cp_attn_args a = { .q = q, .k = k, .v = v, .q_pos = &qp, .k_pos = kp, .out = o, .n = 1, .n_keys = C, .n_heads = H, .n_kv_heads = KV,
                       .head_dim = HD };
    size_t sd = cpu_attention_decode_scratch_floats(&a), sg = cpu_attention_general_scratch_floats(&a);
    float *S = malloc((sd > sg ? sd : sg) * 4);
    if (!S) return 1;
    enum { PATHS = 3 };
    double best[PATHS] = { 1e30, 1e30, 1e30 };
    for (int it = 0; it < R; it++)
        for (int p = 0; p < PATHS; p++) {
            double t0 = now_ms();
            for (int l = 0; l < L; l++) {
                cp_attn_args b = a;
                if (p == 2) b.k = b.v = NULL, b.k16 = k16 + (size_t)l * kn, b.v16 = v16 + (size_t)l * kn;
                else b.k = k + (size_t)l * kn, b.v = v + (size_t)l * kn;
                if (p == 0) cpu_attention_general(&b, S);
                else cpu_attention_decode(&b, S, CPU_ATTN_AUTO);
            }
            double t = now_ms() - t0;
            if (t < best[p]) best[p] = t;
        }
    static const char *const name[PATHS] = { "f32, general (BLAS a head)", "f32, decode kernel", "bf16 in place, decode kernel" };
    const double mb[PATHS] = { 2.0 * kn * 4 / 1e6, 2.0 * kn * 4 / 1e6, 2.0 * kn * 2 / 1e6 };
    printf("decode attention, context %d, %d/%d heads x %d, %d layers' caches, best of %d tokens\n", C, H, KV, HD, L, R);
    printf("  %-30s %12s %14s %10s\n", "path", "ms a token", "MB a layer", "GB/s");
    for (int i = 0; i < PATHS; i++) printf("  %-30s %12.3f %14.2f %10.1f\n", name[i], best[i], mb[i], mb[i] * L / best[i]);
    printf("  decode kernel vs general, f32 cache: %.2fx faster; bf16 in place vs f32 general: %.2fx\n", best[0] / best[1],
           best[0] / best[2]);
    free(q), free(k), free(v), free(o), free(k16), free(v16), free(kp), free(S);
    return 0;
}
