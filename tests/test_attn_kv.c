/* The CPU attention's reuse and bf16-cache paths (kernels/cpu/ops_cpu.h):
 * query blocks bounded by position span (a reuse prefill's scattered
 * computed tokens), and decode over a bf16 cache read in place, each
 * against a plain double-precision reference written here from the
 * definition in backend.h (causal by position, sliding window, GQA). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/ops_cpu.h"
#include "helpers.h"

static uint32_t rng = 777;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return ((float)(rng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* Blocks end at CPU_ATTN_QBLOCK rows or at a position CPU_ATTN_QBLOCK past
 * the block's first: contiguous rows keep the 256-row blocks, scattered
 * ones split where the positions jump. */
Test(attn_kv, query_blocks_end_at_a_position_span)
{
    int32_t pos[600];
    cp_attn_args a = { .q_pos = pos, .n = 600 };
    for (int i = 0; i < 600; i++) pos[i] = 1000 + i;
    cr_assert_eq(cpu_attn_block_rows(&a, 0), CPU_ATTN_QBLOCK, "contiguous rows: a full block");
    cr_assert_eq(cpu_attn_block_rows(&a, 512), 88, "contiguous rows: the rest");
    const int32_t scattered[] = { 0, 1, 2, 255, 256, 300, 301, 900, 1155, 1156 };
    a.q_pos = scattered, a.n = 10;
    cr_assert_eq(cpu_attn_block_rows(&a, 0), 4, "0..255 span 256 positions; 256 starts the next block");
    cr_assert_eq(cpu_attn_block_rows(&a, 4), 3, "256, 300, 301");
    cr_assert_eq(cpu_attn_block_rows(&a, 7), 2, "900, 1155 (1156 is 256 past 900)");
    cr_assert_eq(cpu_attn_block_rows(&a, 9), 1, "the last row alone");
}

/* random operands for n queries at ascending positions qpos against
 * n_keys keys at k_pos (caller's arrays) */
static void fill(cp_attn_args *a, float *q, float *k, float *v)
{
    for (int i = 0; i < a->n * a->n_heads * a->head_dim; i++) q[i] = 2 * rnd();
    for (int i = 0; i < a->n_keys * a->n_kv_heads * a->head_dim; i++) k[i] = rnd(), v[i] = rnd();
}

/* A reuse prefill's shape: queries scattered over a long cache (and past
 * one block), keys out of slot order; the f32 attention with span-bounded
 * blocks matches the reference. */
Test(attn_kv, scattered_queries_attend_as_the_reference_does)
{
    enum { NK = 700, N = 300, H = 6, KV = 2, HD = 20 };
    int32_t qp[N], kp[NK];
    for (int j = 0; j < NK; j++) kp[j] = j < 100 ? 99 - j : j; /* the first 100 placed in reverse */
    for (int i = 0; i < N; i++) qp[i] = i < 200 ? 3 * i : 600 + (i - 200); /* sparse, then dense */
    float *q = malloc(N * H * HD * 4), *k = malloc(NK * KV * HD * 4), *v = malloc(NK * KV * HD * 4);
    float *o = calloc(N * H * HD, 4), *r = calloc(N * H * HD, 4);
    cr_assert(q && k && v && o && r);
    cp_attn_args a = { .q = q, .k = k, .v = v, .q_pos = qp, .k_pos = kp, .out = o, .n = N, .n_keys = NK, .n_heads = H, .n_kv_heads = KV,
                       .head_dim = HD };
    fill(&a, q, k, v);
    float *S = malloc(cpu_attention_scratch_floats(&a) * 4);
    cr_assert(S);
    cpu_attention(&a, S);
    test_attention_ref(&a, k, v, r);
    float d = max_abs_diff(o, r, (size_t)N * H * HD);
    cr_assert(d < 1e-5f, "scattered queries: max |out - reference| %.3g", d);
    free(q), free(k), free(v), free(o), free(r), free(S);
}

/* Decode over a bf16 cache read in place: against the reference over the
 * cache's widened values (the same numbers), f32 accumulation and the
 * polynomial exp (2e-7 relative) -- 1e-5 absolute with |v| <= 1.  Odd
 * sizes: groups of 3 query heads, head_dim 40, a window, keys out of slot
 * order, a query that sees no key. */
static void check_kv16(int n, int nk, int heads, int kv, int hd, int window, int32_t first_q)
{
    const size_t qn = (size_t)n * heads * hd, kn = (size_t)nk * kv * hd;
    float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *o = calloc(qn, 4), *r = calloc(qn, 4);
    uint16_t *k16 = malloc(kn * 2), *v16 = malloc(kn * 2);
    int32_t *qp = malloc((size_t)n * 4), *kp = malloc((size_t)nk * 4);
    cr_assert(q && k && v && o && r && k16 && v16 && qp && kp);
    for (int j = 0; j < nk; j++) kp[j] = (j * 7) % nk; /* a permutation of 0..nk-1 when gcd(7, nk) = 1 */
    for (int i = 0; i < n; i++) qp[i] = first_q + i;
    cp_attn_args a = { .q = q, .q_pos = qp, .k_pos = kp, .out = o, .n = n, .n_keys = nk, .n_heads = heads, .n_kv_heads = kv,
                       .head_dim = hd, .window = window, .k16 = k16, .v16 = v16 };
    fill(&a, q, k, v);
    for (size_t i = 0; i < kn; i++) {
        k16[i] = cp_f32_to_bf16(k[i]), v16[i] = cp_f32_to_bf16(v[i]);
        k[i] = cp_bf16_to_f32(k16[i]), v[i] = cp_bf16_to_f32(v16[i]);
    }
    float *S = malloc(cpu_attention_kv16_scratch_floats(&a) * 4);
    cr_assert(S);
    for (size_t i = 0; i < qn; i++) o[i] = NAN; /* every output element is written */
    cpu_attention_kv16(&a, S);
    test_attention_ref(&a, k, v, r);
    float d = max_abs_diff(o, r, qn);
    cr_assert(d < 1e-5f, "n %d keys %d heads %d/%d hd %d window %d: max |out - reference| %.3g", n, nk, heads, kv, hd, window, d);
    free(q), free(k), free(v), free(o), free(r), free(k16), free(v16), free(qp), free(kp), free(S);
}

Test(attn_kv, bf16_cache_read_in_place_matches_the_reference)
{
    check_kv16(1, 1, 2, 1, 8, 0, 0);        /* the first token */
    check_kv16(1, 333, 6, 2, 40, 0, 332);   /* decode, GQA groups of 3 */
    check_kv16(3, 101, 4, 4, 24, 17, 98);   /* a few rows, a sliding window */
    check_kv16(16, 64, 4, 1, 64, 0, 40);    /* past the cache's positions: rows 40..55 see some keys only */
    check_kv16(2, 50, 2, 2, 16, 5, -3);     /* positions before every key: zeros */
}

/* Through the backend: a decode row and a 32-row prefill over a bf16
 * cache both take the in-place decode kernel (bit-equal to it: one kernel
 * at every row count, so a row is its lone run's), not the widened copy
 * and the general BLAS path (which rounds differently: some element
 * differs). */
Test(attn_kv, the_backend_reads_a_bf16_cache_in_place_at_every_row_count)
{
    cp_backend *be = test_cpu_backend_on(NULL);
    cp_error err = { 0 };
    enum { NK = 257, H = 4, KV = 2, HD = 32 };
    for (int n = 1; n <= 32; n += 31) {
        const size_t qn = (size_t)n * H * HD, kn = (size_t)NK * KV * HD;
        float *q = malloc(qn * 4), *k = malloc(kn * 4), *v = malloc(kn * 4), *o = calloc(qn, 4), *d = calloc(qn, 4), *w = calloc(qn, 4);
        uint16_t *k16 = malloc(kn * 2), *v16 = malloc(kn * 2);
        int32_t *qp = malloc((size_t)n * 4), kp[NK];
        cr_assert(q && k && v && o && d && w && k16 && v16 && qp);
        for (int j = 0; j < NK; j++) kp[j] = j;
        for (int i = 0; i < n; i++) qp[i] = NK - n + i;
        cp_attn_args a = { .q = q, .q_pos = qp, .k_pos = kp, .out = o, .n = n, .n_keys = NK, .n_heads = H, .n_kv_heads = KV, .head_dim = HD,
                           .k16 = k16, .v16 = v16 };
        fill(&a, q, k, v);
        for (size_t i = 0; i < kn; i++) {
            k16[i] = cp_f32_to_bf16(k[i]), v16[i] = cp_f32_to_bf16(v[i]);
            k[i] = cp_bf16_to_f32(k16[i]), v[i] = cp_bf16_to_f32(v16[i]);
        }
        be->attention(be, &a);
        cr_assert_eq(be->sync(be, &err), CP_OK, "%s", err.msg);
        float *S = malloc((cpu_attention_kv16_scratch_floats(&a) + cpu_attention_scratch_floats(&a) +
                           cpu_attention_general_scratch_floats(&a)) * 4);
        cr_assert(S);
        a.out = d;
        cpu_attention_kv16(&a, S);
        cp_attn_args b = a;
        b.k16 = b.v16 = NULL, b.k = k, b.v = v, b.out = w;
        cpu_attention_general(&b, S); /* cpu_attention would take the decode kernel at n <= CPU_ATTN_DECODE_N */
        cr_assert(memcmp(o, d, qn * 4) == 0, "n %d: the backend's attention is the in-place kernel's result", n);
        cr_assert(memcmp(o, w, qn * 4) != 0, "n %d: ... and not the widened path's", n);
        free(q), free(k), free(v), free(o), free(d), free(w), free(k16), free(v16), free(qp), free(S);
    }
    cp_backend_destroy(be);
}
