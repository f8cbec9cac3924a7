/* The three tiny HF-layout fixtures against golden outputs of an independent
 * float64 implementation: logits, greedy ids, attention export, and the
 * equivalences every path must keep (decode = prefill = chunked prefill,
 * RoPE is relative). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/sampler.h"
#include "helpers.h"

typedef struct golden {
    int T, V, L;
    int32_t *ids, greedy[12];
    float *logits, *attn;
} golden;

static void load_golden(const char *fixture, golden *g)
{
    char dir[512], path[600];
    shared_path(dir, sizeof dir, "fixtures");
    snprintf(path, sizeof path, "%s/%s/golden.safetensors", dir, fixture);
    st_set *s = NULL;
    cp_error err = { 0 };
    cr_assert_eq(st_open_file(path, &s, &err), CP_OK, "%s", err.msg);
    st_tensor *ids = st_find(s, "input_ids"), *lg = st_find(s, "logits"), *gr = st_find(s, "greedy_ids"),
              *at = st_find(s, "attn_layer_mean");
    cr_assert(ids && lg && gr && at, "golden file %s lacks a tensor", path);
    g->T = (int)ids->shape[0];
    g->V = (int)lg->shape[1];
    g->L = (int)at->shape[0];
    cr_assert_eq(gr->numel, 12);
    g->ids = malloc(ids->numel * 4);
    g->logits = malloc(lg->numel * 4);
    g->attn = malloc(at->numel * 4);
    cr_assert_eq(st_read_i32(ids, g->ids, &err), CP_OK);
    cr_assert_eq(st_read_i32(gr, g->greedy, &err), CP_OK);
    cr_assert_eq(st_read_f32(lg, g->logits, &err), CP_OK);
    cr_assert_eq(st_read_f32(at, g->attn, &err), CP_OK);
    st_close(s);
}

static void free_golden(golden *g)
{
    free(g->ids);
    free(g->logits);
    free(g->attn);
}

typedef struct fx {
    golden g;
    cp_backend *be;
    cp_model *m;
} fx;

static void open_fixture(const char *name, fx *f)
{
    char dir[512], path[600];
    shared_path(dir, sizeof dir, "fixtures");
    snprintf(path, sizeof path, "%s/%s", dir, name);
    load_golden(name, &f->g);
    f->m = load_model_or_die(path, &f->be);
    cr_assert_eq(f->m->cfg.vocab, f->g.V);
}

static void close_fixture(fx *f)
{
    cp_model_free(f->m);
    cp_backend_destroy(f->be);
    free_golden(&f->g);
}

/* Runs the prompt in pieces of the given sizes (sum = T) and returns all
 * logits. */
static float *run_pieces(fx *f, const int *pieces, int n_pieces, const int32_t *pos)
{
    cp_error err = { 0 };
    cp_state *s = NULL;
    int T = f->g.T;
    cr_assert_eq(cp_state_create(f->m, T + 16, 64, &s, &err), CP_OK, "%s", err.msg);
    float *logits = malloc((size_t)T * f->g.V * sizeof(float));
    int at = 0;
    for (int p = 0; p < n_pieces; p++) {
        cp_status rc = cp_forward(f->m, s, f->g.ids + at, pos ? pos + at : NULL, pieces[p], CP_LOGITS_ALL,
                                  logits + (size_t)at * f->g.V, NULL, &err);
        cr_assert_eq(rc, CP_OK, "%s", err.msg);
        at += pieces[p];
    }
    cr_assert_eq(at, T);
    cp_state_free(f->m, s);
    return logits;
}

static const char *const fixture_names[] = { "qwen2-tiny", "mistral-tiny-swa", "llama-tiny" };

ParameterizedTestParameters(fixtures, prefill_logits_match_golden)
{
    static int idx[] = { 0, 1, 2 };
    return cr_make_param_array(int, idx, 3);
}

ParameterizedTest(int *which, fixtures, prefill_logits_match_golden)
{
    const char *const *name = &fixture_names[*which];
    fx f;
    open_fixture(*name, &f);
    int whole[] = { f.g.T };
    float *lg = run_pieces(&f, whole, 1, NULL);
    size_t n = (size_t)f.g.T * f.g.V;
    float scale = max_abs(f.g.logits, n), d = max_abs_diff(lg, f.g.logits, n);
    cr_assert(d <= 1e-3f * scale, "%s: max |logit - golden| = %g > 1e-3 x %g", *name, d, scale);
    free(lg);
    close_fixture(&f);
}

ParameterizedTestParameters(fixtures, greedy_ids_match_golden)
{
    static int idx[] = { 0, 1, 2 };
    return cr_make_param_array(int, idx, 3);
}

ParameterizedTest(int *which, fixtures, greedy_ids_match_golden)
{
    const char *const *name = &fixture_names[*which];
    fx f;
    open_fixture(*name, &f);
    cp_error err = { 0 };
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(f.m, f.g.T + 12, 64, &s, &err), CP_OK, "%s", err.msg);
    float *lg = malloc((size_t)f.g.V * sizeof(float));
    cr_assert_eq(cp_forward(f.m, s, f.g.ids, NULL, f.g.T, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < 12; i++) {
        int32_t next = cp_argmax(lg, f.g.V);
        cr_assert_eq(next, f.g.greedy[i], "%s: greedy token %d is %d, golden %d", *name, i, next, f.g.greedy[i]);
        cr_assert_eq(cp_forward(f.m, s, &next, NULL, 1, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    }
    free(lg);
    cp_state_free(f.m, s);
    close_fixture(&f);
}

ParameterizedTestParameters(fixtures, decode_and_chunks_equal_prefill)
{
    static int idx[] = { 0, 1, 2 };
    return cr_make_param_array(int, idx, 3);
}

ParameterizedTest(int *which, fixtures, decode_and_chunks_equal_prefill)
{
    const char *const *name = &fixture_names[*which];
    fx f;
    open_fixture(*name, &f);
    int T = f.g.T;
    int whole[] = { T };
    int three[] = { 7, T / 2 - 7, T - T / 2 };
    int *ones = malloc((size_t)T * sizeof(int));
    for (int i = 0; i < T; i++) ones[i] = 1;
    float *a = run_pieces(&f, whole, 1, NULL), *b = run_pieces(&f, three, 3, NULL), *c = run_pieces(&f, ones, T, NULL);
    size_t n = (size_t)T * f.g.V;
    float scale = max_abs(a, n);
    float db = max_abs_diff(a, b, n), dc = max_abs_diff(a, c, n);
    cr_assert(db <= 1e-4f * scale, "%s: 3-chunk prefill differs by %g (scale %g)", *name, db, scale);
    cr_assert(dc <= 1e-4f * scale, "%s: token-by-token decode differs by %g (scale %g)", *name, dc, scale);
    free(a), free(b), free(c), free(ones);
    close_fixture(&f);
}

ParameterizedTestParameters(fixtures, rope_is_relative)
{
    static int idx[] = { 0, 1, 2 };
    return cr_make_param_array(int, idx, 3);
}

ParameterizedTest(int *which, fixtures, rope_is_relative)
{
    const char *const *name = &fixture_names[*which];
    fx f;
    open_fixture(*name, &f);
    int T = f.g.T;
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int i = 0; i < T; i++) pos[i] = 100 + i;
    int whole[] = { T };
    float *a = run_pieces(&f, whole, 1, NULL), *b = run_pieces(&f, whole, 1, pos);
    size_t n = (size_t)T * f.g.V;
    float scale = max_abs(a, n), d = max_abs_diff(a, b, n);
    cr_assert(d <= 1e-4f * scale, "%s: shifting positions by 100 changes logits by %g (scale %g)", *name, d, scale);
    free(a), free(b), free(pos);
    close_fixture(&f);
}

ParameterizedTestParameters(fixtures, attention_export_matches_golden)
{
    static int idx[] = { 0, 1, 2 };
    return cr_make_param_array(int, idx, 3);
}

ParameterizedTest(int *which, fixtures, attention_export_matches_golden)
{
    const char *const *name = &fixture_names[*which];
    fx f;
    open_fixture(*name, &f);
    int T = f.g.T, L = f.g.L;
    cr_assert_eq(L, f.m->cfg.n_layers);
    cp_error err = { 0 };
    float *A = malloc((size_t)T * T * sizeof(float));
    uint8_t *layers = calloc((size_t)L, 1);
    for (int l = 0; l < L; l++) {
        memset(layers, 0, (size_t)L);
        layers[l] = 1;
        memset(A, 0xff, (size_t)T * T * sizeof(float)); /* NaN: every cell must be written */
        cp_state *s = NULL;
        cr_assert_eq(cp_state_create(f.m, T, 16, &s, &err), CP_OK, "%s", err.msg);
        cp_export ex = { .a = A, .ld = T, .layers = layers };
        /* in two pieces, so the export of a chunk's rows is checked too */
        cr_assert_eq(cp_forward(f.m, s, f.g.ids, NULL, 5, CP_LOGITS_NONE, NULL, &ex, &err), CP_OK, "%s", err.msg);
        cr_assert_eq(cp_forward(f.m, s, f.g.ids + 5, NULL, T - 5, CP_LOGITS_NONE, NULL, &ex, &err), CP_OK, "%s", err.msg);
        cp_state_free(f.m, s);
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                float want = f.g.attn[((size_t)l * T + i) * T + j];
                float got = j <= i ? A[(size_t)i * T + j] : 0.0f; /* cells past the row's keys are not exported */
                cr_assert(fabsf(got - want) <= 1e-4f, "%s layer %d: A[%d][%d] = %g, golden %g", *name, l, i, j, got, want);
            }
    }
    /* the mean over all layers is the mean of the per-layer matrices */
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(f.m, T, 64, &s, &err), CP_OK, "%s", err.msg);
    cp_export all = { .a = A, .ld = T };
    cr_assert_eq(cp_forward(f.m, s, f.g.ids, NULL, T, CP_LOGITS_NONE, NULL, &all, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < T; i++)
        for (int j = 0; j <= i; j++) {
            float want = 0;
            for (int l = 0; l < L; l++) want += f.g.attn[((size_t)l * T + i) * T + j] / L;
            cr_assert(fabsf(A[(size_t)i * T + j] - want) <= 1e-4f, "%s all layers: A[%d][%d]", *name, i, j);
        }
    cp_state_free(f.m, s);
    free(A), free(layers);
    close_fixture(&f);
}

ParameterizedTestParameters(fixtures, reuse_prefill_with_placed_kv_equals_plain)
{
    static int idx[] = { 0, 1, 2 };
    return cr_make_param_array(int, idx, 3);
}

/* KV computed in one request and placed into another (here: the same
 * tokens, at the same or shifted positions) plus computing only the other
 * tokens gives the plain prefill's logits: the reuse path is exact when the
 * context matches, and RoPE placement is one exact rotation. */
ParameterizedTest(int *which, fixtures, reuse_prefill_with_placed_kv_equals_plain)
{
    fx f;
    open_fixture(fixture_names[*which], &f);
    int T = f.g.T, V = f.g.V, L = f.m->cfg.n_layers;
    size_t kvd = (size_t)f.m->cfg.n_kv_heads * f.m->cfg.head_dim;
    cp_error err = { 0 };
    cp_state *a = NULL, *b = NULL;
    cr_assert_eq(cp_state_create(f.m, T, 64, &a, &err), CP_OK);
    float *plain = malloc((size_t)T * V * sizeof(float)), *got = malloc((size_t)T * V * sizeof(float));
    cr_assert_eq(cp_forward(f.m, a, f.g.ids, NULL, T, CP_LOGITS_ALL, plain, NULL, &err), CP_OK, "%s", err.msg);
    int32_t *pos = malloc((size_t)T * sizeof *pos), *slots = malloc((size_t)T * sizeof *slots), *toks = malloc((size_t)T * sizeof *toks);
    const float **kp = malloc((size_t)L * sizeof *kp), **vp = malloc((size_t)L * sizeof *vp);
    for (int shift = 0; shift <= 100; shift += 100) {
        /* reuse tokens [5, T - 9) from state a; compute the rest */
        int r0 = 5, r1 = T - 9;
        cr_assert_eq(cp_state_create(f.m, T, 64, &b, &err), CP_OK);
        for (int i = 0; i < T; i++) pos[i] = i + shift;
        for (int l = 0; l < L; l++) {
            kp[l] = a->k_pre + (size_t)l * a->capacity * kvd + (size_t)r0 * kvd;
            vp[l] = a->v + (size_t)l * a->capacity * kvd + (size_t)r0 * kvd;
        }
        cr_assert_eq(cp_state_place(f.m, b, r0, r1 - r0, pos + r0, kp, vp, kvd, &err), CP_OK, "%s", err.msg);
        int n = 0;
        for (int i = 0; i < T; i++)
            if (i < r0 || i >= r1) slots[n] = i, toks[n] = f.g.ids[i], pos[n] = i + shift, n++;
        cr_assert_eq(cp_forward_at(f.m, b, toks, pos, slots, n, T, CP_LOGITS_ALL, got, NULL, &err), CP_OK, "%s", err.msg);
        float scale = max_abs(plain, (size_t)T * V);
        for (int k = 0; k < n; k++) {
            float d = max_abs_diff(got + (size_t)k * V, plain + (size_t)slots[k] * V, (size_t)V);
            cr_assert(d <= 1e-4f * scale, "%s shift %d: token %d differs by %g", fixture_names[*which], shift, slots[k], d);
        }
        /* decoding continues after the placed prompt */
        cr_assert_eq(b->n, T);
        cp_state_free(f.m, b);
    }
    free(plain), free(got), free(pos), free(slots), free(toks), free(kp), free(vp);
    cp_state_free(f.m, a);
    close_fixture(&f);
}

/* A state used before, computing more tokens than one chunk holds: early
 * chunks must see later slots at their true positions (masked), never at
 * what the previous request left behind. */
Test(fixtures, reused_state_and_many_chunks_equal_a_fresh_prefill)
{
    fx f;
    open_fixture("mistral-tiny-swa", &f);
    int T = f.g.T, V = f.g.V;
    cp_error err = { 0 };
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(f.m, T + 8, 7, &s, &err), CP_OK);
    int32_t *slots = malloc((size_t)T * sizeof *slots);
    for (int i = 0; i < T; i++) slots[i] = i;
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    /* dirty the state with another request first */
    int32_t junk[8] = { 3, 1, 4, 1, 5, 9, 2, 6 };
    cr_assert_eq(cp_forward(f.m, s, junk, NULL, 8, CP_LOGITS_NONE, NULL, NULL, &err), CP_OK);
    cr_assert_eq(cp_state_reset(f.m, s, &err), CP_OK);
    cr_assert_eq(cp_forward_at(f.m, s, f.g.ids, slots, slots, T, T, CP_LOGITS_LAST, a, NULL, &err), CP_OK, "%s", err.msg);
    float *want = f.g.logits + (size_t)(T - 1) * V;
    float scale = max_abs(want, (size_t)V);
    cr_assert(max_abs_diff(a, want, (size_t)V) <= 1e-3f * scale, "chunked reuse-path prefill on a used state is wrong");
    cr_assert_eq(cp_state_reset(f.m, s, &err), CP_OK);
    cr_assert_eq(cp_forward_at(f.m, s, f.g.ids, slots, slots, T, T, CP_LOGITS_LAST, b, NULL, &err), CP_OK);
    cr_assert(max_abs_diff(a, b, (size_t)V) == 0.0f, "the same request twice must give the same logits");
    free(a), free(b), free(slots);
    cp_state_free(f.m, s);
    close_fixture(&f);
}

/* the bytes of K, K before RoPE and V of every layer of s not zero */
static long kv_nonzero(const cp_model *m, const cp_state *s)
{
    const size_t row = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim * (s->kv_dtype == CP_BF16 ? 2 : 4);
    long nz = 0;
    for (int w = 0; w < 3; w++)
        for (int l = 0; l < m->cfg.n_layers; l++) {
            const unsigned char *p = cp_state_kv_row(m, s, w, l, 0);
            for (size_t b = 0; b < (size_t)s->capacity * row; b++) nz += p[b] != 0;
        }
    return nz;
}

/* cp_state_reset leaves no byte of any request behind: after a forward at
 * scattered slots (its last the highest written), and after a placement at
 * the last slots of the cache, every element of K, K before RoPE and V of
 * every layer is zero again (it zeroes only the slots written since the
 * last reset), in f32 and bf16 */
Test(fixtures, state_reset_zeroes_every_slot_a_request_wrote)
{
    fx f;
    open_fixture("llama-tiny", &f);
    const cp_config *c = &f.m->cfg;
    const size_t kvd = (size_t)c->n_kv_heads * c->head_dim;
    cp_error err = { 0 };
    for (int bf = 0; bf < 2; bf++) {
        const int cap = 40;
        const char *kv = bf ? "bf16" : "f32";
        cp_state *s = NULL;
        if (cp_state_create_kv(f.m, cap, 8, bf ? CP_BF16 : CP_F32, &s, &err) != CP_OK) {
            cr_log_info("kv %s: %s (skipped)", kv, err.msg);
            continue;
        }
        cr_assert_eq(kv_nonzero(f.m, s), 0, "kv %s: a new state is not zero", kv);
        int32_t ids[5] = { 3, 1, 4, 1, 5 }, slots[5] = { 0, 2, 9, 10, 17 };
        cr_assert_eq(cp_forward_at(f.m, s, ids, slots, slots, 5, 18, CP_LOGITS_NONE, NULL, NULL, &err), CP_OK, "%s", err.msg);
        const size_t esz = bf ? 2 : 4, row = kvd * esz;
        int last = 0; /* the forward's last slot holds KV in every array */
        for (int w = 0; w < 3; w++)
            for (int l = 0; l < c->n_layers; l++) {
                const unsigned char *p = (const unsigned char *)cp_state_kv_row(f.m, s, w, l, 17);
                for (size_t b = 0; b < row; b++) last += p[b] != 0;
            }
        cr_assert(last > 0, "kv %s: the forward wrote nothing at its last slot", kv);
        cr_assert_eq(cp_state_reset(f.m, s, &err), CP_OK);
        cr_assert_eq(kv_nonzero(f.m, s), 0, "kv %s: a forward's KV survived the reset", kv);
        /* a placement at the last slots: rows of ones */
        float *ones = malloc(4 * row);
        for (size_t i = 0; i < 4 * kvd; i++) {
            if (bf) ((uint16_t *)ones)[i] = 0x3f80;
            else ones[i] = 1.0f;
        }
        const void **src = malloc((size_t)c->n_layers * sizeof *src);
        for (int l = 0; l < c->n_layers; l++) src[l] = ones;
        int32_t pos[4] = { 36, 37, 38, 39 };
        cr_assert_eq(cp_state_place_kv(f.m, s, cap - 4, 4, pos, src, src, kvd, &err), CP_OK, "%s", err.msg);
        cr_assert(kv_nonzero(f.m, s) > 0, "kv %s: the placement wrote nothing", kv);
        cr_assert_eq(cp_state_reset(f.m, s, &err), CP_OK);
        cr_assert_eq(kv_nonzero(f.m, s), 0, "kv %s: placed KV survived the reset", kv);
        free(ones), free(src);
        cp_state_free(f.m, s);
    }
    close_fixture(&f);
}

/* cp_state_place_kv_runs places each run as cp_state_place_kv does, to the
 * bit: runs of consecutive positions (a pool block's, taken with RoPE's
 * rows from the model's table, on the threads past a size) and a run whose
 * positions jump (each run then placed by cp_state_place_kv itself), in
 * f32 and bf16, K, K before RoPE and V of every layer */
Test(fixtures, placing_runs_is_placing_each_run)
{
    fx f;
    open_fixture("llama-tiny", &f);
    const cp_config *c = &f.m->cfg;
    const size_t kvd = (size_t)c->n_kv_heads * c->head_dim;
    const int L = c->n_layers, cap = 600;
    cp_error err = { 0 };
    for (int bf = 0; bf < 2; bf++)
        for (int jump = 0; jump < 2; jump++) {
            const size_t esz = bf ? 2 : 4;
            cp_state *a = NULL, *b = NULL;
            if (cp_state_create_kv(f.m, cap, 8, bf ? CP_BF16 : CP_F32, &a, &err) != CP_OK) {
                cr_log_info("kv %s: %s (skipped)", bf ? "bf16" : "f32", err.msg);
                continue;
            }
            cr_assert_eq(cp_state_create_kv(f.m, cap, 8, bf ? CP_BF16 : CP_F32, &b, &err), CP_OK, "%s", err.msg);
            /* source rows per layer: K before RoPE, then V, cap rows each */
            unsigned char *src = malloc((size_t)L * 2 * cap * kvd * esz);
            cr_assert(src);
            uint32_t x = 12345u + (uint32_t)bf;
            for (size_t i = 0; i < (size_t)L * 2 * cap * kvd; i++) {
                x = x * 1664525u + 1013904223u;
                const float v = (float)((int)(x >> 9) % 2001 - 1000) / 500.0f;
                if (bf) ((uint16_t *)(void *)src)[i] = cp_f32_to_bf16(v);
                else ((float *)(void *)src)[i] = v;
            }
            const void *kp[8], *vp[8];
            cr_assert(L <= 8);
            for (int l = 0; l < L; l++)
                kp[l] = src + (size_t)(2 * l) * cap * kvd * esz, vp[l] = src + (size_t)(2 * l + 1) * cap * kvd * esz;
            int32_t pos[600];
            for (int i = 0; i < cap; i++) pos[i] = i;
            if (jump) pos[501] = 530, pos[502] = 510; /* the third run's positions are not consecutive */
            /* three runs, each reading its rows from its own first slot on */
            const int s0[3] = { 0, 16, 500 }, n[3] = { 16, 480, 12 };
            cp_kv_run runs[3];
            const void *rk[3][8], *rv[3][8];
            for (int r = 0; r < 3; r++) {
                for (int l = 0; l < L; l++)
                    rk[r][l] = (const char *)kp[l] + (size_t)s0[r] * kvd * esz, rv[r][l] = (const char *)vp[l] + (size_t)s0[r] * kvd * esz;
                runs[r] = (cp_kv_run){ .slot0 = s0[r], .n = n[r], .pos = pos + s0[r], .k_pre = rk[r], .v = rv[r] };
                cr_assert_eq(cp_state_place_kv(f.m, b, s0[r], n[r], pos + s0[r], rk[r], rv[r], kvd, &err), CP_OK, "%s", err.msg);
            }
            cr_assert_eq(cp_state_place_kv_runs(f.m, a, runs, 3, kvd, &err), CP_OK, "%s", err.msg);
            for (int w = 0; w < 3; w++)
                for (int l = 0; l < L; l++)
                    cr_assert(memcmp(cp_state_kv_row(f.m, a, w, l, 0), cp_state_kv_row(f.m, b, w, l, 0), (size_t)cap * kvd * esz) == 0,
                              "kv %s, %s: array %d layer %d differs from placing each run", bf ? "bf16" : "f32",
                              jump ? "a run with a jump" : "consecutive runs", w, l);
            cr_assert(kv_nonzero(f.m, a) > 0, "the runs wrote nothing");
            cr_assert_eq(cp_state_reset(f.m, a, &err), CP_OK);
            cr_assert_eq(kv_nonzero(f.m, a), 0, "kv %s: KV placed by runs survived the reset", bf ? "bf16" : "f32");
            free(src);
            cp_state_free(f.m, a), cp_state_free(f.m, b);
        }
    close_fixture(&f);
}
