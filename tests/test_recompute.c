/* The request-time recompute methods (engine/recompute.h) on cp-books-6m:
 * a passage stored by one tenant is reused by another after a different
 * document (so its KV lost context).  For each method: R = 1 is a plain
 * prefill, R = 0 is pure reuse, and the number of recomputed tokens is the
 * one the method promises. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/request.h"
#include "../eval/quality.h"
#include "../model/forward_select.h"
#include "helpers.h"

static char *passage(int which, size_t want) { return test_passage(which, want, 3, 997); }

/* the model, tokenizer and detector, loaded once per test */
typedef struct kit {
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    cp_detect_chain chain;
} kit;

static void kit_open(kit *k)
{
    cp_error err = { 0 };
    char dir[512];
    k->m = load_model_or_die(shared_path(dir, sizeof dir, "models/cp-books-6m"), &k->be);
    k->tok = open_tokenizer_or_die("models/cp-books-6m");
    cp_detector *d;
    cp_chain_init(&k->chain);
    cr_assert_eq(cp_detector_builtin(&d, &err), CP_OK);
    cr_assert_eq(cp_chain_add(&k->chain, d, &err), CP_OK);
}

static void kit_close(kit *k)
{
    cp_chain_free(&k->chain);
    cp_tokenizer_free(k->tok);
    cp_model_free(k->m);
    cp_backend_destroy(k->be);
}

/* one engine and its pool */
typedef struct rworld {
    kit *k;
    cp_pool *pool;
    cp_engine *e;
} rworld;

static void world_open(rworld *w, kit *k, const cp_engine_opts *o)
{
    cp_error err = { 0 };
    w->k = k;
    cp_kv_layout l;
    cp_engine_kv_layout(k->m, &l);
    cp_pool_opts po;
    cp_pool_opts_default(&po);
    po.budget_bytes = (size_t)128 << 20;
    cr_assert_eq(cp_pool_create(&l, k->be, &po, &w->pool, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_engine_create(k->m, k->tok, o->sharing == CP_SHARE_NONE ? NULL : w->pool, &k->chain, o, &w->e, &err), CP_OK,
                 "%s", err.msg);
}

static void world_close(rworld *w)
{
    cp_error err = { 0 };
    cr_assert_eq(cp_pool_check(w->pool, &err), CP_OK, "%s", err.msg);
    cp_engine_free(w->e);
    cp_pool_free(w->pool);
}

static void run_msgs(rworld *w, uint32_t tenant, const cp_request_msg *m, size_t n, cp_response *resp)
{
    cp_request r = { .tenant = tenant, .msgs = m, .n_msgs = n, .max_tokens = 1, .sampling = { .top_p = 1 } };
    cp_error err = { 0 };
    cr_assert_eq(cp_engine_run(w->e, &r, resp, &err), CP_OK, "%s", err.msg);
}

/* what the second tenant's request produced */
typedef struct outcome {
    float *logits;
    size_t V;
    int reused, recomputed, segments_hit, hit, partial_rows, stored;
    uint8_t *plan; /* [T]: 0 fresh, 1 reused, 2 recomputed */
    int T;
} outcome;

/* Tenant 1 sends [doc][q1]; tenant 2 sends [other][doc][q2] (its own last
 * question: the last prompt token is fresh, so nothing is forced but what
 * the method forces).  sharing none: the plain prefill of the second. */
static outcome second_request(kit *k, const cp_engine_opts *o, const char *other, const char *doc)
{
    rworld w;
    world_open(&w, k, o);
    const char *q1 = "What happened next?", *q2 = "Who spoke first, and why?";
    cp_request_msg m1[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 }, { CP_ROLE_USER, q1, strlen(q1), 0, NULL, 0 } };
    cp_request_msg m2[3] = { { CP_ROLE_DOCUMENT, other, strlen(other), 0, NULL, 0 }, { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 },
                             { CP_ROLE_USER, q2, strlen(q2), 0, NULL, 0 } };
    cp_response r1, r2;
    if (o->sharing != CP_SHARE_NONE) {
        run_msgs(&w, 1, m1, 2, &r1);
        cp_response_free(&r1);
    }
    run_msgs(&w, 2, m2, 3, &r2);
    int V = k->m->cfg.vocab;
    outcome out = { .logits = malloc((size_t)V * sizeof(float)), .V = (size_t)V, .reused = r2.reused, .recomputed = r2.recomputed,
                    .segments_hit = r2.segments_hit, .hit = r2.shared_hit_tokens + r2.private_hit_tokens, .partial_rows = r2.partial_rows,
                    .stored = r2.segments_stored };
    out.T = r2.prompt_tokens;
    out.plan = malloc((size_t)out.T);
    cr_assert(out.logits && out.plan);
    memcpy(out.logits, cp_engine_last_logits(w.e), (size_t)V * sizeof(float));
    memcpy(out.plan, r2.plan, (size_t)out.T);
    cr_assert_eq(r2.plan[r2.prompt_tokens - 1], 0, "the last prompt token should be fresh (its own question)");
    cp_response_free(&r2);
    world_close(&w);
    return out;
}

static void outcome_free(outcome *o) { free(o->logits), free(o->plan); }

static cp_engine_opts opts_for(cp_recompute_method method, double r, int k0, cp_segkv kv)
{
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.segment_kv = kv;
    o.private_reuse = 0;
    o.recompute_method = method;
    o.annot.r = r;
    o.annot.k0 = k0;
    return o;
}

static float rel_diff(const float *got, const float *want, size_t V) { return max_abs_diff(got, want, V) / max_abs(want, V); }

typedef struct fixture {
    kit k;
    cp_segkv kv;
    char *doc, *other;
    outcome plain, pure;
} fixture;

/* the plain prefill, and pure reuse by the stored flags at r = 0, k0 = 0 */
static void fixture_open(fixture *f, cp_segkv kv)
{
    f->kv = kv;
    kit_open(&f->k);
    f->doc = passage(0, 1500), f->other = passage(1, 700);
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.sharing = CP_SHARE_NONE;
    f->plain = second_request(&f->k, &o, f->other, f->doc);
    o = opts_for(CP_RECOMPUTE_PLAN, 0, 0, f->kv);
    f->pure = second_request(&f->k, &o, f->other, f->doc);
    cr_assert_gt(f->pure.hit, 100, "the second tenant hit only %d tokens of the passage", f->pure.hit);
    cr_assert_eq(f->pure.recomputed, 0, "flags at r = 0, k0 = 0 recomputed %d tokens", f->pure.recomputed);
}

static void fixture_close(fixture *f)
{
    free(f->doc), free(f->other), outcome_free(&f->plain), outcome_free(&f->pure);
    kit_close(&f->k);
}

/* R = 1 equals the plain prefill; R = 0 (k0 = 0) equals pure reuse */
static void ends_of(cp_recompute_method method, cp_segkv kv)
{
    fixture f;
    fixture_open(&f, kv);
    const size_t V = f.plain.V;
    cp_engine_opts o = opts_for(method, 1.0, 0, f.kv);
    outcome all = second_request(&f.k, &o, f.other, f.doc);
    cr_assert_eq(all.reused, 0, "%s at R = 1 left %d tokens reused", cp_recompute_name(method, 0), all.reused);
    cr_assert_eq(all.recomputed, f.pure.reused, "R = 1 recomputes every reused token");
    float d1 = rel_diff(all.logits, f.plain.logits, V);
    cr_assert_leq(d1, 1e-4f, "%s at R = 1: first-token logits differ from a plain prefill by %g (relative)", cp_recompute_name(method, 0), d1);
    o = opts_for(method, 0.0, 0, f.kv);
    outcome none = second_request(&f.k, &o, f.other, f.doc);
    cr_assert_eq(none.recomputed, 0, "%s at R = 0 recomputed %d tokens", cp_recompute_name(method, 0), none.recomputed);
    cr_assert_eq(none.partial_rows, 0, "R = 0 runs no selection");
    /* the annotator read the same fresh rows (the other document's): the same segments stored */
    cr_assert_gt(f.pure.stored, 0, "the second request stored nothing: the test proves nothing");
    cr_assert_eq(none.stored, f.pure.stored, "%s at R = 0 stored %d segments, pure reuse %d", cp_recompute_name(method, 0), none.stored,
                 f.pure.stored);
    float d0 = rel_diff(none.logits, f.pure.logits, V);
    cr_assert_leq(d0, 1e-5f, "%s at R = 0: logits differ from pure reuse by %g (relative)", cp_recompute_name(method, 0), d0);
    cr_assert_gt(rel_diff(f.pure.logits, f.plain.logits, V), 1e-3f, "pure reuse equals the plain prefill: the test proves nothing");
    outcome_free(&all), outcome_free(&none);
    fixture_close(&f);
}

Test(recompute, gradual_ends, .timeout = TEST_TIMEOUT(60)) { ends_of(CP_RECOMPUTE_GRADUAL, CP_SEGKV_IN_CONTEXT); }
Test(recompute, flagged_ends, .timeout = TEST_TIMEOUT(60)) { ends_of(CP_RECOMPUTE_FLAGGED, CP_SEGKV_IN_CONTEXT); }
Test(recompute, epic_ends, .timeout = TEST_TIMEOUT(60)) { ends_of(CP_RECOMPUTE_EPIC, CP_SEGKV_IN_CONTEXT); }

/* canonical segments (KV computed from BOS + the run alone): the same ends */
Test(recompute, canonical_gradual_ends, .timeout = TEST_TIMEOUT(60))
{
    ends_of(CP_RECOMPUTE_GRADUAL, CP_SEGKV_CANONICAL);
}

/* the counts: gradual recomputes ceil(R |U|) and drops the rest layer by
 * layer on its schedule; epic forces each segment's first k0; flagged
 * recomputes no token the stored flags did not name */
Test(recompute, gradual_count_and_schedule, .timeout = TEST_TIMEOUT(60))
{
    fixture f;
    fixture_open(&f, CP_SEGKV_IN_CONTEXT);
    const double R = 0.25, G = 2;
    cp_engine_opts o = opts_for(CP_RECOMPUTE_GRADUAL, R, 0, f.kv);
    o.gradual_start = G;
    outcome g = second_request(&f.k, &o, f.other, f.doc);
    int U = g.reused + g.recomputed, K = (int)ceil(R * U);
    cr_assert_eq(U, f.pure.reused, "the method sees the same hits");
    cr_assert_eq(g.recomputed, K, "gradual recomputed %d of %d reused tokens, want ceil(%g x %d) = %d", g.recomputed, U, R, U, K);
    /* layer 0: every reused token; layers 1..4: ceil(f U) with f going
     * linearly from G R to R; layer 5: K.  Dropped tokens' token-layers: */
    long want = U - K;
    for (int l = 1; l <= 4; l++) want += (long)ceil((G * R + (R - G * R) * (l - 1) / 4.0) * U) - K;
    int V = (int)f.plain.V;
    double kl_g = cp_logits_kl(f.plain.logits, g.logits, V), kl_pure = cp_logits_kl(f.plain.logits, f.pure.logits, V);
    cr_log_info("gradual: %d reused, %d recomputed, %d token-layers dropped; KL %g (pure reuse %g)", U, g.recomputed, g.partial_rows,
                kl_g, kl_pure);
    cr_assert_lt(kl_g, kl_pure, "gradual at R = %g should land closer to the plain prefill than pure reuse", R);
    cr_assert_eq(g.partial_rows, want, "dropped tokens ran %d token-layers, the schedule says %ld", g.partial_rows, want);
    outcome_free(&g);
    fixture_close(&f);
}

Test(recompute, epic_forces_each_segments_first_tokens, .timeout = TEST_TIMEOUT(60))
{
    fixture f;
    fixture_open(&f, CP_SEGKV_IN_CONTEXT);
    const int k0 = 3;
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0, k0, f.kv);
    outcome e0 = second_request(&f.k, &o, f.other, f.doc);
    cr_assert_gt(e0.segments_hit, 0);
    cr_assert_eq(e0.recomputed, k0 * e0.segments_hit, "R = 0: the first %d of each of %d segments, not %d tokens", k0, e0.segments_hit,
                 e0.recomputed);
    o = opts_for(CP_RECOMPUTE_EPIC, 0.25, k0, f.kv);
    outcome e = second_request(&f.k, &o, f.other, f.doc);
    int U = e.reused + e.recomputed, want = (int)ceil(0.25 * U);
    if (want < k0 * e.segments_hit) want = k0 * e.segments_hit;
    cr_assert_eq(e.recomputed, want, "epic recomputed %d, want max(k0 x segments, ceil(R U)) = %d", e.recomputed, want);
    outcome_free(&e0), outcome_free(&e);
    fixture_close(&f);
}

/* --recompute-tail N: the last N reused tokens by position are forced,
 * within R's budget: R = 0 recomputes exactly those N, R = 1 is still the
 * plain prefill, and at R > 0 the count is max(N, ceil(R |U|)) with the N
 * among the recomputed */
Test(recompute, tail_forces_the_last_reused_tokens, .timeout = TEST_TIMEOUT(60))
{
    fixture f;
    fixture_open(&f, CP_SEGKV_IN_CONTEXT);
    const int N = 40;
    cp_engine_opts o = opts_for(CP_RECOMPUTE_GRADUAL, 0, 0, f.kv);
    o.recompute_tail = N;
    outcome t0 = second_request(&f.k, &o, f.other, f.doc);
    int U = t0.reused + t0.recomputed;
    cr_assert_gt(U, 3 * N, "only %d reused: the tail would be all of them", U);
    cr_assert_eq(t0.recomputed, N, "R = 0, tail %d: %d recomputed", N, t0.recomputed);
    for (int t = t0.T - 1, seen = 0; t >= 0; t--) { /* from the end: N recomputed reused tokens, then none */
        if (t0.plan[t] == 0) continue;
        cr_assert_eq(t0.plan[t], seen < N ? 2 : 1, "reused token %d (%d from the end) is %s", t, seen, seen < N ? "not recomputed" : "recomputed");
        seen++;
    }
    o.annot.r = 0.3;
    outcome t3 = second_request(&f.k, &o, f.other, f.doc);
    int want = (int)ceil(0.3 * U) > N ? (int)ceil(0.3 * U) : N;
    cr_assert_eq(t3.recomputed, want, "R 0.3, tail %d: %d recomputed, want max(%d, ceil(0.3 x %d)) = %d", N, t3.recomputed, N, U, want);
    for (int t = t3.T - 1, seen = 0; t >= 0 && seen < N; t--)
        if (t3.plan[t]) {
            cr_assert_eq(t3.plan[t], 2, "reused token %d of the tail was not recomputed at R 0.3", t);
            seen++;
        }
    o.annot.r = 1;
    outcome t1 = second_request(&f.k, &o, f.other, f.doc);
    cr_assert_eq(t1.reused, 0);
    float d1 = rel_diff(t1.logits, f.plain.logits, f.plain.V);
    cr_assert_leq(d1, 1e-4f, "R = 1 with a tail: logits differ from a plain prefill by %g (relative)", d1);
    outcome_free(&t0), outcome_free(&t3), outcome_free(&t1);
    fixture_close(&f);
}

/* --recompute-per-segment x: R grows by x for each reused segment that is
 * not exact, R' = min(1, R + x s): the count is ceil(R' |U|); x large
 * enough is a plain prefill */
Test(recompute, per_segment_grows_R_with_the_segments_hit, .timeout = TEST_TIMEOUT(60))
{
    fixture f;
    fixture_open(&f, CP_SEGKV_IN_CONTEXT);
    cp_engine_opts o = opts_for(CP_RECOMPUTE_GRADUAL, 0.1, 0, f.kv);
    o.recompute_per_segment = 0.03;
    outcome g = second_request(&f.k, &o, f.other, f.doc);
    int U = g.reused + g.recomputed, s = g.segments_hit;
    cr_assert_geq(s, 2, "one segment hit: the test cannot tell per segment from once");
    double r = 0.1 + 0.03 * s;
    int want = (int)ceil((r < 1 ? r : 1) * U);
    cr_assert_eq(g.recomputed, want, "R 0.1 + 0.03 x %d segments of %d reused: %d recomputed, want %d", s, U, g.recomputed, want);
    o.recompute_per_segment = 1;
    outcome all = second_request(&f.k, &o, f.other, f.doc);
    cr_assert_eq(all.reused, 0, "R' capped at 1 left %d reused", all.reused);
    float d1 = rel_diff(all.logits, f.plain.logits, f.plain.V);
    cr_assert_leq(d1, 1e-4f, "R' = 1: logits differ from a plain prefill by %g (relative)", d1);
    outcome_free(&g), outcome_free(&all);
    fixture_close(&f);
}

/* The engine's default is epic at R 0.85 (the documented default, chosen
 * from the frontier): the request recomputes max(k0 x segments,
 * ceil(0.85 |U|)) tokens.  (cp_annot_opts_default once overwrote R with the
 * stored flags' 0.15 after it was set.) */
Test(recompute, the_default_recomputes_the_documented_R, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *doc = passage(0, 1500), *other = passage(1, 700);
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.private_reuse = 0;
    outcome d = second_request(&k, &o, other, doc);
    int U = d.reused + d.recomputed, want = (int)ceil(0.85 * U);
    if (want < 2 * d.segments_hit) want = 2 * d.segments_hit;
    cr_assert_gt(U, 100);
    cr_assert_eq(d.recomputed, want, "the default recomputed %d of %d reused, want max(2 x %d, ceil(0.85 x %d)) = %d", d.recomputed, U,
                 d.segments_hit, U, want);
    outcome_free(&d);
    free(doc), free(other);
    kit_close(&k);
}

Test(recompute, flagged_chooses_among_the_stored_flags, .timeout = TEST_TIMEOUT(60))
{
    fixture f;
    fixture_open(&f, CP_SEGKV_IN_CONTEXT);
    /* the stored flags at r = 0.5, k0 = 8: what the plan path recomputes */
    cp_engine_opts o = opts_for(CP_RECOMPUTE_PLAN, 0.5, 8, f.kv);
    outcome flags = second_request(&f.k, &o, f.other, f.doc);
    o = opts_for(CP_RECOMPUTE_FLAGGED, 0.5, 8, f.kv);
    outcome sel = second_request(&f.k, &o, f.other, f.doc);
    int U = sel.reused + sel.recomputed, want = (int)ceil(0.5 * U);
    if (want > flags.recomputed) want = flags.recomputed;
    cr_assert_eq(sel.recomputed, want, "flagged recomputed %d; min(ceil(R U) = %d, flagged %d) = %d", sel.recomputed,
                 (int)ceil(0.5 * U), flags.recomputed, want);
    /* its probe ran over the flagged tokens only: one layer each, less the kept */
    cr_assert_eq(sel.partial_rows, flags.recomputed - sel.recomputed, "the probe's rows: %d", sel.partial_rows);
    outcome_free(&flags), outcome_free(&sel);
    fixture_close(&f);
}

/* The selective prefill with nothing ranked computes what cp_forward_at
 * computes, export included: the annotator's attention rows and the
 * per-row sensitive mass the row limit reads (a privacy input) are the
 * same, so a method cannot loosen what gets stored.  With a want mask
 * (the request path's: fresh rows only) the wanted rows' export adds into
 * its rows over the layers in the plain prefill's order: bit for bit
 * equal, the other rows untouched. */
/* cp_export.rows into a dense T x T matrix (a row never handed over stays zero) */
typedef struct dense_rows {
    float *a;
    int T;
} dense_rows;

static cp_status dense_rows_take(void *ctx, const float *rows, size_t ld, const int32_t *slots, int n, cp_error *err)
{
    (void)err;
    dense_rows *d = ctx;
    for (int k = 0; k < n; k++) memcpy(d->a + (size_t)slots[k] * d->T, rows + (size_t)k * ld, (size_t)d->T * sizeof(float));
    return CP_OK;
}

/* with_want 2: the rows go to a rows() consumer (the annotator's way); 3:
 * the same, the selective prefill's rows kept (cp_select_args.held) and
 * handed over only by cp_select_held_deliver, as the request path does
 * after its first token */
static void selective_export_case(int with_want)
{
    cp_backend *be;
    char dir[512];
    cp_model *m = load_model_or_die(shared_path(dir, sizeof dir, "models/cp-books-6m"), &be);
    const int T = 300, V = m->cfg.vocab, L = m->cfg.n_layers;
    int32_t *ids = malloc(T * sizeof *ids), *pos = malloc(T * sizeof *pos);
    uint8_t *sens = calloc(T, 1), *fixed = malloc(T);
    float *A[2] = { calloc((size_t)T * T, sizeof(float)), calloc((size_t)T * T, sizeof(float)) };
    float *mass[2] = { calloc(T, sizeof(float)), calloc(T, sizeof(float)) }, *lg[2] = { malloc(V * sizeof(float)), malloc(V * sizeof(float)) };
    int *keep = calloc((size_t)L, sizeof *keep);
    uint8_t *want = malloc(T);
    cr_assert(ids && pos && sens && fixed && A[0] && A[1] && mass[0] && mass[1] && lg[0] && lg[1] && keep && want);
    for (int i = 0; i < T; i++)
        ids[i] = 1 + (i * 37) % (V - 1), pos[i] = i, fixed[i] = 1, sens[i] = i % 50 == 7, want[i] = (i / 37) % 2 == 0 || i == T - 1;
    cp_error err = { 0 };
    for (int way = 0; way < 2; way++) {
        cp_state *s;
        cr_assert_eq(cp_state_create(m, T, 128, &s, &err), CP_OK, "%s", err.msg); /* 128: several chunks */
        cp_export ex = { .a = A[way], .ld = T, .sensitive = sens, .sens_mass = mass[way], .want = with_want ? want : NULL };
        dense_rows dr = { A[way], T };
        if (with_want >= 2) ex.a = NULL, ex.ld = 0, ex.rows = dense_rows_take, ex.rows_ctx = &dr;
        if (way == 0) {
            cr_assert_eq(cp_forward_at(m, s, ids, pos, pos, T, T, CP_LOGITS_LAST, lg[0], &ex, &err), CP_OK, "%s", err.msg);
        } else {
            cp_select_held held = { 0 };
            cp_select_args a = { .tokens = ids, .pos = pos, .slots = pos, .n = T, .n_keys = T, .fixed = fixed, .keep = keep, .ex = &ex,
                                 .held = with_want == 3 ? &held : NULL };
            cr_assert_eq(cp_forward_select(m, s, &a, lg[1], NULL, &err), CP_OK, "%s", err.msg);
            if (with_want == 3) {
                cr_assert(held.E && held.n == T, "the export was not kept");
                cr_assert(max_abs(A[1], (size_t)T * T) == 0 && max_abs(mass[1], T) == 0, "a kept export reached its consumer early");
                cr_assert_eq(cp_select_held_deliver(&held, &ex, &err), CP_OK, "%s", err.msg);
                cr_assert(!held.E, "a delivered export is freed");
            }
        }
        cp_state_free(m, s);
    }
    float dm = max_abs_diff(mass[0], mass[1], T), da = max_abs_diff(A[0], A[1], (size_t)T * T), dl = max_abs_diff(lg[0], lg[1], V);
    cr_assert_gt(max_abs(mass[0], T), 0.01f, "no attention on the sensitive tokens: the test proves nothing");
    cr_assert_gt(max_abs(A[0], (size_t)T * T), 0.01f, "no export reached the consumer: the test proves nothing");
    cr_assert_leq(dm, 1e-6f, "sensitive mass differs by %g", dm);
    cr_assert_leq(da, 1e-6f, "attention export differs by %g", da);
    cr_assert_leq(dl, 1e-4f * max_abs(lg[0], V), "logits differ by %g", dl);
    if (with_want && (be->flags & CP_BE_HOST_MEMORY)) {
        cr_assert(memcmp(A[0], A[1], (size_t)T * T * sizeof(float)) == 0 && memcmp(mass[0], mass[1], T * sizeof(float)) == 0,
                  "the wanted rows' export is not the plain prefill's bit for bit");
        for (int i = 0; i < T; i++)
            if (!want[i]) cr_assert(A[1][(size_t)i * T] == 0 && mass[1][i] == 0, "row %d is not wanted but was exported", i);
    }
    for (int w = 0; w < 2; w++) free(A[w]), free(mass[w]), free(lg[w]);
    free(ids), free(pos), free(sens), free(fixed), free(keep), free(want);
    cp_model_free(m);
    cp_backend_destroy(be);
}

Test(recompute, selective_prefill_export_equals_the_plain_one, .timeout = TEST_TIMEOUT(30)) { selective_export_case(0); }
Test(recompute, selective_prefill_export_of_the_wanted_rows_is_the_plain_ones, .timeout = TEST_TIMEOUT(30)) { selective_export_case(1); }
Test(recompute, selective_prefill_hands_its_consumer_the_plain_ones_rows, .timeout = TEST_TIMEOUT(30)) { selective_export_case(2); }
Test(recompute, selective_prefill_keeps_its_rows_for_a_later_consumer, .timeout = TEST_TIMEOUT(30)) { selective_export_case(3); }

/* A passage hit where it was computed (right after BOS, then and now) has
 * exact KV: a method recomputes none of it and runs no selection on it,
 * and the result is the plain prefill's. */
Test(recompute, exact_prefix_hits_are_not_recomputed, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *doc = passage(0, 160); /* short: stored as one segment */
    const char *q1 = "What happened next?", *q2 = "Who spoke first, and why?";
    cp_request_msg m1[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 }, { CP_ROLE_USER, q1, strlen(q1), 0, NULL, 0 } };
    cp_request_msg m2[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 }, { CP_ROLE_USER, q2, strlen(q2), 0, NULL, 0 } };
    float *lg[2];
    int V = k.m->cfg.vocab;
    for (int way = 0; way < 2; way++) { /* 0: plain; 1: gradual at R 0.5 after tenant 1 stored the passage */
        cp_engine_opts o = opts_for(CP_RECOMPUTE_GRADUAL, 0.5, 2, CP_SEGKV_IN_CONTEXT);
        if (way == 0) o.sharing = CP_SHARE_NONE;
        rworld w;
        world_open(&w, &k, &o);
        cp_response r1, r2;
        if (way) run_msgs(&w, 1, m1, 2, &r1), cp_response_free(&r1);
        run_msgs(&w, 2, m2, 2, &r2);
        if (way) {
            cr_assert_gt(r2.reused, 30, "only %d tokens reused", r2.reused);
            cr_assert_eq(r2.recomputed, 0, "%d exact tokens recomputed", r2.recomputed);
            cr_assert_eq(r2.partial_rows, 0, "a selection ran over exact tokens (%d token-layers)", r2.partial_rows);
        }
        lg[way] = malloc((size_t)V * sizeof(float));
        memcpy(lg[way], cp_engine_last_logits(w.e), (size_t)V * sizeof(float));
        cp_response_free(&r2);
        world_close(&w);
    }
    float d = rel_diff(lg[1], lg[0], (size_t)V);
    cr_assert_leq(d, 1e-4f, "exact reuse differs from the plain prefill by %g", d);
    free(lg[0]), free(lg[1]), free(doc);
    kit_close(&k);
}

/* cp_state_place of slots [from, n) of src's KV into dst at the same
 * positions (src's KV was computed after another prefix: stale here) */
static void place_from(cp_model *m, cp_state *src, cp_state *dst, int from, int n)
{
    const int L = m->cfg.n_layers;
    const size_t kvd = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    const void *kp[64], *vp[64];
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int i = 0; i < n; i++) pos[i] = from + i;
    for (int l = 0; l < L; l++) { /* rows in the states' own KV dtype */
        kp[l] = cp_state_kv_row(m, src, 0, l, from);
        vp[l] = cp_state_kv_row(m, src, 1, l, from);
    }
    cp_error err = { 0 };
    cr_assert_eq(cp_state_place_kv(m, dst, from, n - from, pos, kp, vp, kvd, &err), CP_OK, "%s", err.msg);
    free(pos);
}

/* The set the selective prefill keeps after one shrink at layer 1 is the
 * top K by the layer-1 K/V deviation that cp_forward_deviation (the
 * deviation method's own probe) measures for the same placed KV. */
static void kept_set_case(cp_dtype kv)
{
    cp_backend *be;
    char dir[512];
    cp_model *m = load_model_or_die(shared_path(dir, sizeof dir, "models/cp-books-6m"), &be);
    const int T = 200, P = 50, V = m->cfg.vocab, L = m->cfg.n_layers, K = 30;
    int32_t *a = malloc(T * sizeof *a), *b = malloc(T * sizeof *b), *pos = malloc(T * sizeof *pos);
    uint8_t *fixed = calloc(T, 1), *depth = calloc(T, 1);
    int *keep = malloc((size_t)L * sizeof *keep);
    float *dev = calloc(T, sizeof *dev), *lg = malloc(V * sizeof *lg);
    for (int i = 0; i < T; i++) { /* the same tokens from P on, other ones before */
        a[i] = 1 + (i * 37) % (V - 1), b[i] = i < P ? 1 + (i * 101 + 7) % (V - 1) : a[i], pos[i] = i;
        fixed[i] = i < P || i == T - 1;
    }
    keep[0] = T - P - 1;
    for (int l = 1; l < L; l++) keep[l] = K;
    cp_error err = { 0 };
    cp_state *src, *s1, *s2;
    cr_assert_eq(cp_state_create_kv(m, T, 64, kv, &src, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_forward(m, src, a, NULL, T, CP_LOGITS_NONE, NULL, NULL, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_state_create_kv(m, T, 64, kv, &s1, &err), CP_OK);
    cr_assert_eq(cp_state_create_kv(m, T, 64, kv, &s2, &err), CP_OK);
    place_from(m, src, s1, P, T), place_from(m, src, s2, P, T);
    cp_select_args sa = { .tokens = b, .pos = pos, .slots = pos, .n = T, .n_keys = T, .fixed = fixed, .keep = keep };
    cr_assert_eq(cp_forward_select(m, s1, &sa, lg, depth, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_forward_deviation(m, s2, b, pos, pos, T, T, 1, dev, &err), CP_OK, "%s", err.msg);
    /* the K-th largest deviation among the ranked tokens */
    float *d = malloc((size_t)T * sizeof *d);
    int nd = 0;
    for (int i = P; i < T - 1; i++) d[nd++] = dev[i];
    for (int x = 0; x < nd; x++) /* partial selection sort: the top K first */
        for (int y = x + 1; x < K && y < nd; y++)
            if (d[y] > d[x]) { float t = d[x]; d[x] = d[y]; d[y] = t; }
    int kept = 0;
    for (int i = P; i < T - 1; i++) {
        kept += depth[i] == L;
        cr_assert(depth[i] == L || depth[i] == 1, "token %d ran %d layers (kept: all, dropped: layer 0 only)", i, depth[i]);
        if (dev[i] > d[K - 1]) cr_assert_eq(depth[i], L, "token %d deviates %g (above the K-th, %g) and was dropped", i, dev[i], d[K - 1]);
        if (dev[i] < d[K - 1]) cr_assert_eq(depth[i], 1, "token %d deviates %g (below the K-th, %g) and was kept", i, dev[i], d[K - 1]);
    }
    cr_assert_eq(kept, K);
    float dmin = d[0];
    for (int i = P; i < T - 1; i++) dmin = dev[i] < dmin ? dev[i] : dmin;
    cr_assert_gt(d[0], 2 * dmin + 1e-6f, "the deviations do not spread: the test proves nothing");
    free(d), free(a), free(b), free(pos), free(fixed), free(depth), free(keep), free(dev), free(lg);
    cp_state_free(m, src), cp_state_free(m, s1), cp_state_free(m, s2);
    cp_model_free(m);
    cp_backend_destroy(be);
}

Test(recompute, the_kept_set_is_the_most_deviating, .timeout = TEST_TIMEOUT(30)) { kept_set_case(CP_F32); }

/* over a bf16 cache: the selective prefill's probe (forward_select.c) and
 * cp_forward_deviation read the same widened rows */
Test(recompute, bf16_kv_the_kept_set_is_the_most_deviating, .timeout = TEST_TIMEOUT(30)) { kept_set_case(CP_BF16); }

/* ---- exactness proved along a chain of hits (engine/request.c, mark_exact) ---- */

static const char *const chain_q1 = "What happened next?", *const chain_q2 = "Who spoke first, and why?";

/* tenant sends [doc][q]; the response is the caller's to free */
static void send_doc(rworld *w, uint32_t tenant, const char *doc, const char *q, cp_response *r)
{
    cp_request_msg m[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 }, { CP_ROLE_USER, q, strlen(q), 0, NULL, 0 } };
    run_msgs(w, tenant, m, 2, r);
}

static int is_exact(const cp_response *r, int t) { return (r->plan_flags[t] & CP_PLAN_EXACT) != 0; }

/* the reused tokens of r that are not proved exact, and how many of them are */
static int not_exact_reused(const cp_response *r)
{
    int u = 0;
    for (int t = 0; t < r->prompt_tokens; t++) u += r->plan[t] != 0 && !is_exact(r, t);
    return u;
}

/* A long document is stored as several segments; the second tenant sends it
 * after the same BOS: every segment after the first is proved exact by the
 * chain of hits before it, so the default recomputes none of it and the
 * result is the plain prefill's. */
Test(recompute, chain_proven_exact_recomputes_none_of_it, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *doc = passage(0, 1400);
    float *lg[2];
    int V = k.m->cfg.vocab;
    for (int way = 0; way < 2; way++) { /* 0: plain; 1: the default (epic R 0.75) after tenant 1 stored the document */
        cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
        if (way == 0) o.sharing = CP_SHARE_NONE;
        rworld w;
        world_open(&w, &k, &o);
        cp_response r1, r2;
        if (way) send_doc(&w, 1, doc, chain_q1, &r1), cp_response_free(&r1);
        send_doc(&w, 2, doc, chain_q2, &r2);
        if (way) {
            cr_assert_geq(r2.segments_hit, 3, "only %d segments hit: no chain to prove", r2.segments_hit);
            cr_assert_gt(r2.reused, 250, "only %d tokens reused", r2.reused);
            cr_assert_eq(not_exact_reused(&r2), 0, "%d reused tokens not proved exact", not_exact_reused(&r2));
            cr_assert_eq(r2.recomputed, 0, "%d exact tokens recomputed", r2.recomputed);
            cr_assert_eq(r2.partial_rows, 0, "a selection ran over exact tokens (%d token-layers)", r2.partial_rows);
        }
        lg[way] = malloc((size_t)V * sizeof(float));
        cr_assert(lg[way]);
        memcpy(lg[way], cp_engine_last_logits(w.e), (size_t)V * sizeof(float));
        cp_response_free(&r2);
        world_close(&w);
    }
    float d = rel_diff(lg[1], lg[0], (size_t)V);
    cr_assert_leq(d, 1e-4f, "chain-proved reuse differs from the plain prefill by %g", d);
    free(lg[0]), free(lg[1]), free(doc);
    kit_close(&k);
}

/* One different token in the middle: the segments before it stay exact,
 * none after it is (its context is not the creator's), and those are
 * recomputed as the method promises without the proof: ceil(R |U|). */
Test(recompute, chain_broken_by_one_token_recomputes_as_before, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *doc = passage(0, 1400), *doc2 = strdup(doc);
    cr_assert(doc2);
    size_t mid = strlen(doc2) / 2;
    while (doc2[mid] && !(doc2[mid] >= 'a' && doc2[mid] <= 'z')) mid++;
    cr_assert(doc2[mid]);
    doc2[mid] = doc2[mid] == 'e' ? 'a' : 'e';
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
    rworld w;
    world_open(&w, &k, &o);
    cp_response r1, r2;
    send_doc(&w, 1, doc, chain_q1, &r1);
    send_doc(&w, 2, doc2, chain_q2, &r2);
    int d = 0;
    while (d < r2.prompt_tokens && d < r1.prompt_tokens && r1.prompt_ids[d] == r2.prompt_ids[d]) d++;
    cr_assert_lt(d, r2.prompt_tokens - 20, "the changed letter changed no token");
    int before = 0, after = 0, reused_after = 0;
    for (int t = 0; t < r2.prompt_tokens; t++) {
        if (t < d) before += is_exact(&r2, t);
        else after += is_exact(&r2, t), reused_after += r2.plan[t] != 0;
    }
    cr_assert_gt(before, 100, "only %d tokens before the change proved exact", before);
    cr_assert_gt(reused_after, 50, "only %d tokens reused after the change: nothing to test", reused_after);
    cr_assert_eq(after, 0, "%d tokens after a changed token proved exact", after);
    int u = not_exact_reused(&r2);
    cr_assert_eq(r2.recomputed, (int)ceil(0.75 * u), "%d recomputed of %d not exact reused", r2.recomputed, u);
    cp_response_free(&r1), cp_response_free(&r2);
    world_close(&w);
    free(doc), free(doc2);
    kit_close(&k);
}

/* The segments of r's prompt whose lookup (a third tenant's, shared) hits at
 * the position they were stored at: how many f(segment, lim) holds for */
static int stored_at_place(rworld *w, const cp_response *r, int (*f)(const cp_segment *, int), int lim)
{
    cp_error err = { 0 };
    const cp_kv_layout *l = cp_pool_layout(w->pool);
    cp_lookup q = { .tenant = 3, .fingerprint = l->fingerprint, .tokens = r->prompt_ids, .n = (size_t)r->prompt_tokens,
                    .sensitive = r->sensitive };
    cp_matches m = { 0 };
    cr_assert_eq(cp_pool_lookup(w->pool, &q, &m, &err), CP_OK, "%s", err.msg);
    int n = 0;
    for (size_t i = 0; i < m.n; i++) {
        const cp_segment *s = cp_pool_segment(w->pool, &m, i);
        cr_assert(s);
        if ((uint32_t)s->start_pos == m.v[i].pos) n += f(s, lim);
    }
    cp_pool_release(w->pool, &m);
    cp_matches_free(&m);
    return n;
}

static int first_sensitive(const cp_response *r)
{
    for (int t = 0; t < r->prompt_tokens; t++)
        if (r->sensitive[t]) return t;
    return r->prompt_tokens;
}

/* lim: the first position whose token may not be vouched for after */
static int vouched_after(const cp_segment *s, int lim) { return s->has_context && s->start_pos > lim; }
static int stored_after(const cp_segment *s, int lim) { return s->start_pos > lim; }
static int vouched_before(const cp_segment *s, int lim) { return s->has_context && s->start_pos > 1 && s->start_pos + (int)s->len <= lim; }

/* A sensitive word (marked: documents are not scanned) a third of the way
 * in: no segment after it carries a context hash (the creator's
 * prefix held a secret: nothing may ever be compared with it), and no
 * request proves one exact; the segments before it are vouched for and
 * proved as usual. */
/* The proof reaches the secret at token s0 and stops there: more than 100
 * tokens before it proved exact, more than 50 reused after it (something to
 * prove), none of those proved. */
static void proof_stops_at(const cp_response *r, int s0, const char *secret)
{
    int before = 0, after = 0, reused_after = 0;
    for (int t = 0; t < r->prompt_tokens; t++) {
        if (t < s0) before += is_exact(r, t);
        else after += is_exact(r, t), reused_after += r->plan[t] != 0;
    }
    cr_assert_gt(before, 100, "only %d tokens before the secret proved exact", before);
    cr_assert_gt(reused_after, 50, "only %d tokens reused after the secret: nothing to test", reused_after);
    cr_assert_eq(after, 0, "%d tokens after %s proved exact", after, secret);
}

/* a word a third of the way into doc, marked sensitive */
static cp_span secret_word(const char *doc)
{
    size_t mid = strlen(doc) / 3, end;
    while (doc[mid] && !(doc[mid] >= 'a' && doc[mid] <= 'z')) mid++;
    while (mid && doc[mid - 1] >= 'a' && doc[mid - 1] <= 'z') mid--;
    for (end = mid; doc[end] >= 'a' && doc[end] <= 'z';) end++;
    cr_assert_gt(end, mid);
    return (cp_span){ .start = (uint32_t)mid, .end = (uint32_t)end, .type = "NAME", .score = 1 };
}

static void send_marked(rworld *w, uint32_t tenant, const char *doc, const cp_span *sp, const char *q, cp_response *r)
{
    cp_request_msg m[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, sp, 1 }, { CP_ROLE_USER, q, strlen(q), 0, NULL, 0 } };
    run_msgs(w, tenant, m, 2, r);
}

Test(recompute, chain_never_crosses_a_sensitive_token, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *docs = passage(0, 1400);
    cp_span sp = secret_word(docs);
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
    /* the contextual limits off (a test setting, never a default): with them the text after a
     * secret is seldom stored at all, and the chain rule must hold without their help */
    o.annot.row_limit = 1, o.annot.beta = 1;
    rworld w;
    world_open(&w, &k, &o);
    cp_response r1, r2;
    send_marked(&w, 1, docs, &sp, chain_q1, &r1);
    int s0 = first_sensitive(&r1);
    cr_assert_lt(s0, r1.prompt_tokens - 100, "the address is not sensitive (%d), or sits too late (of %d)", s0, r1.prompt_tokens);
    cr_assert_gt(stored_at_place(&w, &r1, vouched_before, s0), 0, "no segment before the secret vouched for: the test proves nothing");
    cr_assert_gt(stored_at_place(&w, &r1, stored_after, s0), 0, "no segment stored after the secret: the test proves nothing");
    cr_assert_eq(stored_at_place(&w, &r1, vouched_after, s0), 0, "a segment after a sensitive token carries its context hash");
    send_marked(&w, 2, docs, &sp, chain_q2, &r2);
    proof_stops_at(&r2, s0, "a sensitive token");
    cp_response_free(&r1), cp_response_free(&r2);
    world_close(&w);
    free(docs);
    kit_close(&k);
}

/* A creator whose own prefix was reused out of context (not exact) computed
 * what follows over stale KV: it vouches for none of it, so no later
 * request can take that KV as exact. */
Test(recompute, chain_needs_an_exact_creator, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *a = passage(0, 700), *b = passage(1, 300), *c = passage(1, 1500);
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
    rworld w;
    world_open(&w, &k, &o);
    cp_response r1, r2;
    send_doc(&w, 1, a, chain_q1, &r1);
    /* tenant 2: [b][a][c + q]: a is reused after b (out of context), c is computed after it */
    const char *ac = c + 300;
    cp_request_msg m[4] = { { CP_ROLE_DOCUMENT, b, strlen(b), 0, NULL, 0 }, { CP_ROLE_DOCUMENT, a, strlen(a), 0, NULL, 0 },
                            { CP_ROLE_DOCUMENT, ac, strlen(ac), 0, NULL, 0 }, { CP_ROLE_USER, chain_q2, strlen(chain_q2), 0, NULL, 0 } };
    run_msgs(&w, 2, m, 4, &r2);
    cr_assert_gt(not_exact_reused(&r2), 50, "the document was not reused out of context");
    int stale = 0; /* the first token whose KV is not exact */
    while (stale < r2.prompt_tokens && (r2.plan[stale] == 0 || is_exact(&r2, stale))) stale++;
    cr_assert_gt(stored_at_place(&w, &r2, vouched_before, stale), 0, "nothing before the stale KV vouched for: the test proves nothing");
    cr_assert_gt(r2.segments_stored, 2, "tenant 2 stored %d segments: nothing to test", r2.segments_stored);
    cr_assert_eq(stored_at_place(&w, &r2, vouched_after, stale), 0, "a segment computed over stale KV carries its context hash");
    cp_response_free(&r1), cp_response_free(&r2);
    world_close(&w);
    free(a), free(b), free(c);
    kit_close(&k);
}

/* The request's own secret: tenant 1 stored the document plain (vouched for
 * throughout); tenant 2 sends the same text with one word marked sensitive.
 * That word is computed fresh, and no hit after it is proved exact, though
 * its tokens equal the creator's: a proof past it would tell tenant 2
 * (by its recompute count) whether its secret equals what others sent. */
Test(recompute, chain_never_compares_the_requests_secret, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *doc = passage(0, 1400);
    cp_span sp = secret_word(doc);
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
    rworld w;
    world_open(&w, &k, &o);
    cp_response r1, r2;
    send_doc(&w, 1, doc, chain_q1, &r1);
    send_marked(&w, 2, doc, &sp, chain_q2, &r2);
    int s0 = first_sensitive(&r2);
    cr_assert_lt(s0, r2.prompt_tokens - 100, "the word is not sensitive (%d of %d)", s0, r2.prompt_tokens);
    cr_assert_gt(stored_at_place(&w, &r1, vouched_after, s0), 0, "nothing after the word vouched for: the test proves nothing");
    proof_stops_at(&r2, s0, "the request's own sensitive token");
    cp_response_free(&r1), cp_response_free(&r2);
    world_close(&w);
    free(doc);
    kit_close(&k);
}

/* Under --admit-k 2 a context is vouched for only when two tenants produced
 * the whole prefix, as a shared segment's own tokens must be -- even when
 * every part of it is shared.  x is made shared (tenants 1 and 2 send it);
 * tenant 3 sends d after y (x with one word changed: the same length), and
 * tenant 4 sends d after x: its copy admits d, stored shared at the same
 * place, after a prefix the pool holds as shared, yet only tenant 4 ever
 * sent [x][d].  Tenants 5 and 6 both send [x][d2]: that prefix was
 * produced twice, and is vouched for. */
Test(recompute, chain_under_admit_k_needs_k_tenants_prefix, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *d = passage(0, 700), *d2 = passage(2, 900), *x = passage(1, 500), *y = strdup(x);
    cr_assert(y);
    char *w1 = strstr(y + strlen(y) / 3, " the "); /* " the" -> " and": one common word for another */
    cr_assert(w1, "no ' the ' in x");
    memcpy(w1 + 1, "and", 3);
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
    o.admit_k = 2;
    /* every run one segment per message (a test setting): the same document gives the same
     * segment whatever came before it, so its admission depends on the tenants alone */
    o.annot.tau = 0, o.annot.beta = 1, o.annot.row_limit = 1;
    rworld w;
    world_open(&w, &k, &o);
    cp_response r[6];
    const char *open[6] = { x, x, y, x, x, x }, *doc[6] = { NULL, NULL, d, d, d2, d2 };
    for (int i = 0; i < 6; i++) {
        cp_request_msg m[3] = { { CP_ROLE_DOCUMENT, open[i], strlen(open[i]), 0, NULL, 0 },
                                { CP_ROLE_DOCUMENT, doc[i] ? doc[i] : "", doc[i] ? strlen(doc[i]) : 0, 0, NULL, 0 },
                                { CP_ROLE_USER, chain_q1, strlen(chain_q1), 0, NULL, 0 } };
        if (!doc[i]) m[1] = m[2];
        run_msgs(&w, (uint32_t)i + 1, m, doc[i] ? 3 : 2, &r[i]);
    }
    cr_assert_eq(r[3].prompt_tokens, r[2].prompt_tokens, "y's length in tokens is not x's: d is not at one place");
    cr_assert_gt(r[3].shared_hit_tokens, 30, "x is not shared for tenant 4: the test proves nothing");
    int d0 = 0; /* where [x][q] and [x][d][q] part: x's own segments are vouched for before it */
    while (d0 < r[0].prompt_tokens && r[0].prompt_ids[d0] == r[3].prompt_ids[d0]) d0++;
    cr_assert_gt(stored_at_place(&w, &r[3], stored_after, d0 - 1), 0, "tenant 4's copy of d is not shared at its place: nothing to test");
    cr_assert_eq(stored_at_place(&w, &r[3], vouched_after, d0 - 1), 0, "a prefix one tenant produced was vouched for under admit-k 2");
    cr_assert_gt(stored_at_place(&w, &r[5], vouched_after, d0 - 1), 0, "a prefix two tenants produced was not vouched for");
    for (int i = 0; i < 6; i++) cp_response_free(&r[i]);
    world_close(&w);
    free(d), free(d2), free(x), free(y);
    kit_close(&k);
}

/* Two documents: the template's markup between them is computed fresh in
 * both requests (no tenant's text), so the chain goes on across it and the
 * second document is proved exact too; the result is the plain prefill's. */
Test(recompute, chain_goes_on_across_the_templates_markup, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *x = passage(1, 500), *d = passage(0, 900);
    float *lg[2];
    int V = k.m->cfg.vocab;
    for (int way = 0; way < 2; way++) {
        cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
        if (way == 0) o.sharing = CP_SHARE_NONE;
        rworld w;
        world_open(&w, &k, &o);
        cp_response r[2];
        for (int i = way ? 0 : 1; i < 2; i++) {
            const char *q = i ? chain_q2 : chain_q1;
            cp_request_msg m[3] = { { CP_ROLE_DOCUMENT, x, strlen(x), 0, NULL, 0 }, { CP_ROLE_DOCUMENT, d, strlen(d), 0, NULL, 0 },
                                    { CP_ROLE_USER, q, strlen(q), 0, NULL, 0 } };
            run_msgs(&w, (uint32_t)i + 1, m, 3, &r[i]);
        }
        if (way) {
            int fresh_inside = 0, last_reused = 0; /* fresh tokens between the two documents' hits */
            for (int t = 0; t < r[1].prompt_tokens; t++)
                if (r[1].plan[t]) last_reused = t;
            for (int t = 1; t < last_reused; t++) fresh_inside += r[1].plan[t] == 0;
            cr_assert_gt(fresh_inside, 0, "no markup computed between the documents: the test proves nothing");
            cr_assert_gt(r[1].reused, 250, "only %d tokens reused", r[1].reused);
            cr_assert_eq(not_exact_reused(&r[1]), 0, "%d reused tokens not proved exact", not_exact_reused(&r[1]));
            cr_assert_eq(r[1].recomputed, 0, "%d exact tokens recomputed", r[1].recomputed);
            cp_response_free(&r[0]);
        }
        lg[way] = malloc((size_t)V * sizeof(float));
        cr_assert(lg[way]);
        memcpy(lg[way], cp_engine_last_logits(w.e), (size_t)V * sizeof(float));
        cp_response_free(&r[1]);
        world_close(&w);
    }
    float dd = rel_diff(lg[1], lg[0], (size_t)V);
    cr_assert_leq(dd, 1e-4f, "chain-proved reuse differs from the plain prefill by %g", dd);
    free(lg[0]), free(lg[1]), free(x), free(d);
    kit_close(&k);
}

/* A short document between two long ones is below the annotator's minimum
 * length, so it is never stored: a later request computes it fresh.  The
 * chain stops there although its tokens equal the creator's (no hit shows
 * them: a proof past them would tell the request what its creator sent that
 * the pool never stored) -- and the creator vouches for nothing after it
 * either: a shared segment's context hash is only ever taken over text the
 * pool holds as shared and template markup. */
Test(recompute, chain_stops_at_text_computed_fresh, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *d1 = passage(1, 500), *d2 = passage(0, 900);
    const char *s = "See below.";
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
    rworld w;
    world_open(&w, &k, &o);
    cp_response r[2];
    for (int i = 0; i < 2; i++) {
        const char *q = i ? chain_q2 : chain_q1;
        cp_request_msg m[4] = { { CP_ROLE_DOCUMENT, d1, strlen(d1), 0, NULL, 0 }, { CP_ROLE_DOCUMENT, s, strlen(s), 0, NULL, 0 },
                                { CP_ROLE_DOCUMENT, d2, strlen(d2), 0, NULL, 0 }, { CP_ROLE_USER, q, strlen(q), 0, NULL, 0 } };
        run_msgs(&w, (uint32_t)i + 1, m, 4, &r[i]);
    }
    int gap = 1; /* the first fresh token after the first document's hits */
    while (gap < r[1].prompt_tokens && r[1].plan[gap]) gap++;
    while (gap < r[1].prompt_tokens && !r[1].plan[gap] && r[1].prompt_ids[gap] == r[0].prompt_ids[gap]) gap++;
    int before = 0, after = 0, reused_after = 0;
    for (int t = 0; t < r[1].prompt_tokens; t++) {
        if (t < gap) before += is_exact(&r[1], t);
        else after += is_exact(&r[1], t), reused_after += r[1].plan[t] != 0;
    }
    cr_assert_gt(stored_at_place(&w, &r[0], stored_after, gap), 0, "the creator stored nothing after the gap: the test proves nothing");
    cr_assert_eq(stored_at_place(&w, &r[0], vouched_after, gap), 0, "the creator vouched for a segment after text the pool never held");
    cr_assert_gt(before, 100, "only %d tokens before the gap proved exact", before);
    cr_assert_gt(reused_after, 100, "only %d tokens reused after the gap: nothing to test", reused_after);
    cr_assert_eq(after, 0, "%d tokens after fresh text proved exact", after);
    cp_response_free(&r[0]), cp_response_free(&r[1]);
    world_close(&w);
    free(d1), free(d2);
    kit_close(&k);
}

/* The tenant's own private segment (its earlier prompt, whole, secret
 * included) is exact where it starts, but a chain never goes on past its
 * secret: the shared hits after it are not proved exact, though their
 * creator (another tenant) had the same tokens there unmarked. */
Test(recompute, chain_never_extends_over_a_private_secret, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *doc = passage(0, 1000), *d2 = passage(1, 900);
    cp_span sp = secret_word(doc);
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
    o.private_reuse = 1;
    rworld w;
    world_open(&w, &k, &o);
    cp_response r[3];
    /* tenant 1: [doc][d2][q] unmarked; tenant 2: [doc, word marked][q], then [doc, word marked][d2][q] */
    cp_request_msg m1[3] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 }, { CP_ROLE_DOCUMENT, d2, strlen(d2), 0, NULL, 0 },
                             { CP_ROLE_USER, chain_q1, strlen(chain_q1), 0, NULL, 0 } };
    cp_request_msg m2[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, &sp, 1 }, { CP_ROLE_USER, chain_q2, strlen(chain_q2), 0, NULL, 0 } };
    cp_request_msg m3[3] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, &sp, 1 }, { CP_ROLE_DOCUMENT, d2, strlen(d2), 0, NULL, 0 },
                             { CP_ROLE_USER, chain_q2, strlen(chain_q2), 0, NULL, 0 } };
    run_msgs(&w, 1, m1, 3, &r[0]);
    run_msgs(&w, 2, m2, 2, &r[1]);
    run_msgs(&w, 2, m3, 3, &r[2]);
    cr_assert_gt(r[2].private_hit_tokens, 100, "tenant 2's own prompt was not hit (%d)", r[2].private_hit_tokens);
    int s0 = first_sensitive(&r[2]), end_priv = 0, after = 0, reused_after = 0;
    cr_assert_lt(s0, r[2].prompt_tokens, "the word is not sensitive");
    cr_assert(is_exact(&r[2], s0), "the private hit over the secret is not exact where it starts: the test proves nothing");
    while (end_priv < r[2].prompt_tokens && (r[2].plan[end_priv] == 0 || is_exact(&r[2], end_priv))) end_priv++;
    for (int t = end_priv; t < r[2].prompt_tokens; t++) after += is_exact(&r[2], t), reused_after += r[2].plan[t] != 0;
    cr_assert_gt(reused_after, 100, "only %d tokens reused after the private hit: nothing to test", reused_after);
    cr_assert_eq(after, 0, "%d tokens after the private secret proved exact", after);
    for (int i = 0; i < 3; i++) cp_response_free(&r[i]);
    world_close(&w);
    free(doc), free(d2);
    kit_close(&k);
}

/* Every token before a hit is an exact hit at its place, yet not the hit's
 * creator's context: tenant 1 sent [A][B], tenant 2 [A'] (one word of A
 * changed: the same length in tokens), and tenant 3 sends [A'][B].  A' is
 * proved exact piece by piece (A's head, then tenant 2's tail after the same
 * head), B is not: the context hash B was stored with is [A]'s. */
Test(recompute, chain_needs_the_creators_very_context, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    char *a = passage(1, 500), *b = passage(0, 900), *a2 = strdup(a);
    cr_assert(a2);
    char *w1 = strstr(a2 + strlen(a2) / 3, " the "); /* " the" -> " and": one common word for another */
    cr_assert(w1);
    memcpy(w1 + 1, "and", 3);
    cp_engine_opts o = opts_for(CP_RECOMPUTE_EPIC, 0.75, 2, CP_SEGKV_IN_CONTEXT);
    /* every run one segment per message (a test setting): tenant 2's tail after the change is
     * stored whole, so tenant 3's [A'] is hits from end to end */
    o.annot.tau = 0, o.annot.beta = 1, o.annot.row_limit = 1;
    rworld w;
    world_open(&w, &k, &o);
    cp_response r[3];
    const char *first[3] = { a, a2, a2 };
    for (int i = 0; i < 3; i++) {
        const char *q = i == 1 ? chain_q2 : chain_q1;
        cp_request_msg m[3] = { { CP_ROLE_DOCUMENT, first[i], strlen(first[i]), 0, NULL, 0 }, { CP_ROLE_DOCUMENT, b, strlen(b), 0, NULL, 0 },
                                { CP_ROLE_USER, q, strlen(q), 0, NULL, 0 } };
        if (i == 1) m[1] = m[2];
        run_msgs(&w, (uint32_t)i + 1, m, i == 1 ? 2 : 3, &r[i]);
    }
    cr_assert_eq(r[2].prompt_tokens, r[0].prompt_tokens, "the changed letter changed the length in tokens: B is not at its place");
    int b0 = 0; /* where tenant 3's prompt leaves tenant 2's: B's message */
    while (b0 < r[2].prompt_tokens && b0 < r[1].prompt_tokens && r[1].prompt_ids[b0] == r[2].prompt_ids[b0]) b0++;
    int fresh_before = 0, not_exact_before = 0, after = 0, reused_after = 0;
    for (int t = 1; t < r[2].prompt_tokens; t++) {
        if (t < b0) fresh_before += r[2].plan[t] == 0, not_exact_before += r[2].plan[t] != 0 && !is_exact(&r[2], t);
        else after += is_exact(&r[2], t), reused_after += r[2].plan[t] != 0;
    }
    cr_assert_leq(fresh_before, 6, "%d tokens of [A'] computed fresh: not a chain of hits, the test proves nothing", fresh_before);
    cr_assert_eq(not_exact_before, 0, "%d tokens of [A'] not proved exact", not_exact_before);
    cr_assert_gt(reused_after, 100, "only %d tokens of B reused: nothing to test", reused_after);
    cr_assert_eq(after, 0, "%d tokens of B proved exact after a context that is not its creator's", after);
    for (int i = 0; i < 3; i++) cp_response_free(&r[i]);
    world_close(&w);
    free(a), free(a2), free(b);
    kit_close(&k);
}

/* ---- the chain proof vouches only from what another tenant could probe ---- */

/* Tenant 1 sends [P1][a short sentence the detector misses][P2][q]: the
 * sentence is too short to be stored, P2 is stored shared.  Tenant 2 sends
 * [P1][candidate] (stored as its own private prompt), then the whole prompt
 * with the candidate, no-store.  What tenant 2's second request costs
 * (computed, reused, recomputed, exact) must not depend on whether its
 * candidate is tenant 1's sentence: the pool never held that sentence as
 * shared.  out[0..3]: computed, reused, recomputed, tokens proved exact. */
static void chain_oracle_probe(kit *k, const cp_engine_opts *o, const char *cand, int out[4])
{
    char *p1 = passage(1, 500), *p2 = passage(0, 900);
    const char *secret = "our meeting word is purple elephant";
    rworld w;
    world_open(&w, k, o);
    cp_response r[3];
    cp_request_msg a[4] = { { CP_ROLE_DOCUMENT, p1, strlen(p1), 0, NULL, 0 }, { CP_ROLE_USER, secret, strlen(secret), 0, NULL, 0 },
                            { CP_ROLE_DOCUMENT, p2, strlen(p2), 0, NULL, 0 }, { CP_ROLE_USER, chain_q1, strlen(chain_q1), 0, NULL, 0 } };
    cp_request_msg b[4] = { { CP_ROLE_DOCUMENT, p1, strlen(p1), 0, NULL, 0 }, { CP_ROLE_USER, cand, strlen(cand), 0, NULL, 0 },
                            { CP_ROLE_DOCUMENT, p2, strlen(p2), 0, NULL, 0 }, { CP_ROLE_USER, chain_q1, strlen(chain_q1), 0, NULL, 0 } };
    run_msgs(&w, 1, a, 4, &r[0]);
    cr_assert_eq(r[0].sensitive_tokens, 0, "the detector found the sentence: the test proves nothing");
    run_msgs(&w, 2, b, 2, &r[1]);
    cp_request rq = { .tenant = 2, .msgs = b, .n_msgs = 4, .max_tokens = 1, .sampling = { .top_p = 1 }, .no_store = 1 };
    cp_error err = { 0 };
    cr_assert_eq(cp_engine_run(w.e, &rq, &r[2], &err), CP_OK, "%s", err.msg);
    cr_assert_gt(r[2].shared_hit_tokens, 150, "P2 was not hit shared (%d tokens): nothing to test", r[2].shared_hit_tokens);
    int exact = 0;
    for (int t = 0; t < r[2].prompt_tokens; t++) exact += is_exact(&r[2], t);
    out[0] = r[2].computed, out[1] = r[2].reused, out[2] = r[2].recomputed, out[3] = exact;
    for (int i = 0; i < 3; i++) cp_response_free(&r[i]);
    world_close(&w);
    free(p1), free(p2);
}

Test(recompute, chain_never_vouches_for_text_the_pool_holds_only_privately, .timeout = TEST_TIMEOUT(60))
{
    kit k;
    kit_open(&k);
    cp_engine_opts o;
    cp_engine_opts_default(&o); /* the shipped default: epic R 0.85, private reuse on */
    int yes[4], no[4];
    chain_oracle_probe(&k, &o, "our meeting word is purple elephant", yes);
    chain_oracle_probe(&k, &o, "our meeting word is orange elephant", no);
    cr_assert(yes[0] == no[0] && yes[1] == no[1] && yes[2] == no[2] && yes[3] == no[3],
              "the true candidate costs computed %d reused %d recomputed %d (exact %d), a wrong one %d %d %d (exact %d)", yes[0], yes[1],
              yes[2], yes[3], no[0], no[1], no[2], no[3]);
    kit_close(&k);
}
