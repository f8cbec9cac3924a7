/* cp-books-6m (trained here, BF16, 1024 context) against its float64
 * golden: logits over 256 held-out tokens, attention export, greedy ids. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/sampler.h"
#include "helpers.h"

Test(cp_books, logits_attention_and_greedy_match_golden)
{
    char dir[512], path[600];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    cp_error err = { 0 };
    st_set *g = NULL;
    cr_assert_eq(st_open_file(path, &g, &err), CP_OK, "%s", err.msg);
    st_tensor *ti = st_find(g, "input_ids"), *tl = st_find(g, "logits"), *ta = st_find(g, "attn_layer_mean"),
              *tg = st_find(g, "greedy_ids");
    cr_assert(ti && tl && ta && tg);
    int T = (int)ti->shape[0], V = (int)tl->shape[1], L = (int)ta->shape[0], G = (int)tg->shape[0];
    int32_t *ids = malloc((size_t)T * 4), *greedy = malloc((size_t)G * 4);
    float *want = malloc(tl->numel * 4), *attn = malloc(ta->numel * 4);
    cr_assert_eq(st_read_i32(ti, ids, &err), CP_OK);
    cr_assert_eq(st_read_i32(tg, greedy, &err), CP_OK);
    cr_assert_eq(st_read_f32(tl, want, &err), CP_OK);
    cr_assert_eq(st_read_f32(ta, attn, &err), CP_OK);

    cp_backend *be;
    cp_model *m = load_model_or_die(dir, &be);
    cr_assert_eq(m->cfg.vocab, V);
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, T, 128, &s, &err), CP_OK, "%s", err.msg);
    float *lg = malloc((size_t)T * V * 4), *A = calloc((size_t)T * T, 4);
    uint8_t layers[64] = { 0 };
    layers[L - 1] = 1; /* the last layer's export, checked below */
    cp_export ex = { .a = A, .ld = T, .layers = layers };
    cr_assert_eq(cp_forward(m, s, ids, NULL, T, CP_LOGITS_ALL, lg, &ex, &err), CP_OK, "%s", err.msg);
    float scale = max_abs(want, (size_t)T * V), d = max_abs_diff(lg, want, (size_t)T * V);
    cr_assert(d <= 1e-3f * scale, "max |logit - golden| = %g > 1e-3 x %g", d, scale);
    cp_state_free(m, s);
    /* every layer's export against the golden per-layer means */
    for (int l = 0; l < L; l++) {
        memset(layers, 0, sizeof layers);
        layers[l] = 1;
        cr_assert_eq(cp_state_create(m, T, 128, &s, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(cp_forward(m, s, ids, NULL, T, CP_LOGITS_NONE, NULL, &ex, &err), CP_OK, "%s", err.msg);
        cp_state_free(m, s);
        for (int i = 0; i < T; i++)
            for (int j = 0; j <= i; j++) {
                float w = attn[((size_t)l * T + i) * T + j];
                cr_assert(fabsf(A[(size_t)i * T + j] - w) <= 1e-4f, "layer %d A[%d][%d] = %g, golden %g", l, i, j,
                          A[(size_t)i * T + j], w);
            }
    }

    /* greedy continuation of the first 64 ids */
    cr_assert_eq(cp_state_create(m, 64 + G, 64, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_forward(m, s, ids, NULL, 64, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < G; i++) {
        int32_t next = cp_argmax(lg, V);
        cr_assert_eq(next, greedy[i], "greedy token %d is %d, golden %d", i, next, greedy[i]);
        cr_assert_eq(cp_forward(m, s, &next, NULL, 1, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    }
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
    st_close(g);
    free(ids), free(greedy), free(want), free(attn), free(lg), free(A);
}

/* RoPE is relative: 24 tokens at positions 70 000.. give the logits they
 * give at 0.. to rounding.  Past the model's kept cos/sin rows (its
 * context, at least 2^16 positions) each row is computed as the pass needs
 * it; inside them from the kept table -- both ways the same arithmetic. */
Test(cp_books, rope_past_the_kept_table_is_the_same_rotation)
{
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    cp_backend *be;
    cp_model *m = load_model_or_die(dir, &be);
    enum { N = 24 };
    int32_t ids[N], pos[N];
    for (int i = 0; i < N; i++) ids[i] = 7 + (i * 131) % 3000;
    const int V = m->cfg.vocab;
    float *a = malloc((size_t)N * V * 4), *b = malloc((size_t)N * V * 4);
    cr_assert(a && b);
    cp_error err = { 0 };
    for (int far = 0; far < 2; far++) {
        for (int i = 0; i < N; i++) pos[i] = (far ? 70000 : 0) + i;
        cp_state *s = NULL;
        cr_assert_eq(cp_state_create(m, N, 16, &s, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(cp_forward(m, s, ids, pos, N, CP_LOGITS_ALL, far ? b : a, NULL, &err), CP_OK, "%s", err.msg);
        cp_state_free(m, s);
    }
    float scale = max_abs(a, (size_t)N * V), d = max_abs_diff(a, b, (size_t)N * V);
    cr_assert(d <= 1e-3f * scale, "positions 70000.. differ from 0.. by %g (scale %g)", d, scale);
    free(a), free(b);
    cp_model_free(m);
    cp_backend_destroy(be);
}
