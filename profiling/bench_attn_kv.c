/* Decode attention over a long cache, one query row, the 0.5B shape's heads
 * (14 query heads, 2 KV heads, head_dim 64) by default: an f32 cache
 * (cpu_attention: BLAS per head), a bf16 cache widened into an f32 copy
 * first (what decode did before), and a bf16 cache read in place
 * (cpu_attention_kv16).  Best of R calls each, interleaved; ms a layer, ms
 * a token over L layers, and the bytes each reads.
 *
 * usage: bench_attn_kv [--context C] [--layers L] [--rounds R] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops_cpu.h"
#include "bench_clock.h"

int main(int argc, char **argv)
{
    int C = 4096, L = 24, R = 20, H = 14, KV = 2, HD = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--context") == 0) C = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--layers") == 0) L = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rounds") == 0) R = atoi(argv[i + 1]);
    }
    if (C < 1 || L < 1 || R < 1) return fprintf(stderr, "usage: bench_attn_kv [--context C] [--layers L] [--rounds R]\n"), 2;
    const size_t kn = (size_t)C * KV * HD;
    float *q = malloc((size_t)H * HD * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *o = malloc((size_t)H * HD * 4);
    float *wide = malloc(2 * kn * 4);
    uint16_t *k16 = malloc(kn * 2), *v16 = malloc(kn * 2);
    int32_t *kp = malloc((size_t)C * 4), qp = C - 1;
    if (!q || !k || !v || !o || !wide || !k16 || !v16 || !kp) return fprintf(stderr, "bench_attn_kv: out of memory\n"), 1;
    uint32_t r = 1;
    for (int i = 0; i < H * HD; i++) r = r * 1664525u + 1013904223u, q[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < kn; i++) {
        r = r * 1664525u + 1013904223u, k[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
        r = r * 1664525u + 1013904223u, v[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
        k16[i] = cp_f32_to_bf16(k[i]), v16[i] = cp_f32_to_bf16(v[i]);
    }
    for (int j = 0; j < C; j++) kp[j] = j;
    cp_attn_args a = { .q = q, .k = k, .v = v, .q_pos = &qp, .k_pos = kp, .out = o, .n = 1, .n_keys = C, .n_heads = H, .n_kv_heads = KV,
                       .head_dim = HD };
    cp_attn_args b = a;
    b.k = b.v = NULL, b.k16 = k16, b.v16 = v16;
    size_t sf = cpu_attention_scratch_floats(&a), sf16 = cpu_attention_kv16_scratch_floats(&b);
    float *S = malloc((sf > sf16 ? sf : sf16) * 4);
    if (!S) return 1;
    double best[3] = { 1e30, 1e30, 1e30 };
    for (int it = 0; it < R; it++) {
        double t0 = now_ms();
        cpu_attention(&a, S);
        double t1 = now_ms();
        cp_convert_float(wide, CP_F32, k16, CP_BF16, kn); /* the old path: widen K and V, then the f32 attention */
        cp_convert_float(wide + kn, CP_F32, v16, CP_BF16, kn);
        cp_attn_args w = a;
        w.k = wide, w.v = wide + kn;
        cpu_attention(&w, S);
        double t2 = now_ms();
        cpu_attention_kv16(&b, S);
        double t3 = now_ms();
        if (t1 - t0 < best[0]) best[0] = t1 - t0;
        if (t2 - t1 < best[1]) best[1] = t2 - t1;
        if (t3 - t2 < best[2]) best[2] = t3 - t2;
    }
    static const char *const name[3] = { "f32 cache (BLAS per head)", "bf16 cache widened, then f32", "bf16 cache read in place" };
    const double mb[3] = { 2.0 * kn * 4 / 1e6, 2.0 * kn * 2 / 1e6 + 2.0 * 2 * kn * 4 / 1e6, 2.0 * kn * 2 / 1e6 };
    printf("decode attention, context %d, %d/%d heads x %d, best of %d\n", C, H, KV, HD, R);
    printf("  %-30s %10s %12s %14s\n", "path", "ms a layer", "ms a token", "MB moved/layer");
    for (int i = 0; i < 3; i++) printf("  %-30s %10.3f %12.2f %14.2f\n", name[i], best[i], best[i] * L, mb[i]);
    printf("  in place vs widened: %.2fx faster; vs f32 cache: %.2fx\n", best[1] / best[2], best[0] / best[2]);
    free(q), free(k), free(v), free(o), free(wide), free(k16), free(v16), free(kp), free(S);
    return 0;
}
