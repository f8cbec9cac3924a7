/* Continuous batching through the request path (engine/batch/batcher.h) on
 * cp-books-6m: requests in flight together give each the output it gets
 * alone from cp_engine_run — same ids, text and reuse plan — under sharing
 * none, under cacheprune with a pool that does not change (the same plans
 * by construction), and under cacheprune storing (the batched attention
 * export makes the same segments). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/batch/batcher.h"
#include "helpers.h"

#define NREQ 8

typedef struct world {
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    cp_detect_chain chain;
} world;

static void world_open(world *w)
{
    cp_error err = { 0 };
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    w->m = load_model_or_die(dir, &w->be);
    w->tok = open_tokenizer_or_die("models/cp-books-6m");
    cp_detector *d;
    cp_chain_init(&w->chain);
    cr_assert_eq(cp_detector_builtin(&d, &err), CP_OK);
    cr_assert_eq(cp_chain_add(&w->chain, d, &err), CP_OK);
}

static void world_close(world *w)
{
    cp_chain_free(&w->chain);
    cp_tokenizer_free(w->tok);
    cp_model_free(w->m);
    cp_backend_destroy(w->be);
}

static cp_engine *engine_with(world *w, cp_sharing sharing, cp_recompute_method method, cp_pool **pool)
{
    cp_error err = { 0 };
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.sharing = sharing;
    o.recompute_method = method;
    *pool = NULL;
    if (sharing != CP_SHARE_NONE) {
        cp_kv_layout l;
        cp_engine_kv_layout(w->m, &l);
        cp_pool_opts po;
        cp_pool_opts_default(&po);
        po.budget_bytes = (size_t)128 << 20;
        cr_assert_eq(cp_pool_create(&l, w->be, &po, pool, &err), CP_OK, "%s", err.msg);
    }
    cp_engine *e = NULL;
    cr_assert_eq(cp_engine_create(w->m, w->tok, *pool, &w->chain, &o, &e, &err), CP_OK, "%s", err.msg);
    return e;
}

/* the default recompute method (epic, chosen at request time) */
static cp_engine *engine(world *w, cp_sharing sharing, cp_pool **pool)
{
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    return engine_with(w, sharing, o.recompute_method, pool);
}

static char *passage(int which, size_t want) { return test_passage(which, want, 4, 1543); }

typedef struct req {
    char *doc, question[96];
    cp_request_msg msgs[2];
    cp_request r;
    cp_response resp;
    cp_status rc;
} req;

/* request i: a document of its own length, a question, its own max_tokens,
 * every third sampled with a seed */
static void make_req(req *q, int i, int doc_of, uint32_t tenant, int no_store, const char *tag)
{
    memset(q, 0, sizeof *q);
    q->doc = passage(doc_of, 100 + (size_t)((doc_of * 211) % 400));
    snprintf(q->question, sizeof q->question, "%s question %d: what happens to the %s next?", tag, i, i % 2 ? "doctor" : "painter");
    q->msgs[0] = (cp_request_msg){ CP_ROLE_DOCUMENT, q->doc, strlen(q->doc), 0, NULL, 0 };
    q->msgs[1] = (cp_request_msg){ CP_ROLE_USER, q->question, strlen(q->question), 0, NULL, 0 };
    q->r = (cp_request){ .tenant = tenant, .msgs = q->msgs, .n_msgs = 2, .max_tokens = 3 + (i * 5) % 11, .no_store = no_store,
                         .sampling = { .top_p = 1 } };
    if (i % 3 == 2) q->r.sampling.temperature = 0.8f, q->r.sampling.seed = 77 + (uint64_t)i;
}

static void free_req(req *q)
{
    cp_response_free(&q->resp);
    free(q->doc);
}

static void run_alone(cp_engine *e, req *v, int n)
{
    cp_error err = { 0 };
    for (int i = 0; i < n; i++) {
        v[i].rc = cp_engine_run(e, &v[i].r, &v[i].resp, &err);
        cr_assert_eq(v[i].rc, CP_OK, "request %d alone: %s", i, err.msg);
    }
}

static int n_done;
static void on_done(void *ctx, void *user, cp_status rc, const cp_error *err)
{
    (void)ctx;
    req *q = user;
    q->rc = rc;
    cr_assert_eq(rc, CP_OK, "batched request: %s", err->msg);
    n_done++;
}

/* the requests through a batcher, at most `conc` in flight, submitted in order */
static void run_batched(cp_engine *e, req *v, int n, int conc, int step_tokens)
{
    cp_error err = { 0 };
    cp_batcher *b = NULL;
    cp_batcher_opts o = { .max_running = conc, .step_tokens = step_tokens, .kv_bytes = (size_t)256 << 20 };
    cr_assert_eq(cp_batcher_create(e, &o, &b, &err), CP_OK, "%s", err.msg);
    n_done = 0;
    int next = 0, steps = 0;
    while (n_done < n) {
        while (next < n && cp_batcher_pending(b) < (size_t)conc) {
            v[next].rc = -1;
            cr_assert_eq(cp_batcher_submit(b, &v[next].r, &v[next].resp, &v[next], NULL, &err), CP_OK, "%s", err.msg);
            next++;
        }
        cr_assert_eq(cp_batcher_step(b, on_done, NULL, &err), CP_OK, "%s", err.msg);
        cr_assert(++steps < 5000);
    }
    cr_assert_eq(cp_batcher_pending(b), 0);
    cp_batcher_free(b);
}

static void expect_same(const req *a, const req *b, int n, int plans, const char *what)
{
    for (int i = 0; i < n; i++) {
        const cp_response *x = &a[i].resp, *y = &b[i].resp;
        cr_assert_eq(y->n_ids, x->n_ids, "%s: request %d: %zu ids batched, %zu alone", what, i, y->n_ids, x->n_ids);
        for (size_t k = 0; k < x->n_ids; k++)
            cr_assert_eq(y->ids[k], x->ids[k], "%s: request %d token %zu: batched %d, alone %d", what, i, k, y->ids[k], x->ids[k]);
        cr_assert_str_eq(y->text, x->text, "%s: request %d text", what, i);
        cr_assert_eq(y->finish, x->finish, "%s: request %d ended for another reason batched (%d) than alone (%d)", what, i,
                     (int)y->finish, (int)x->finish);
        cr_assert((y->finish == CP_FINISH_LENGTH && y->n_ids == (size_t)a[i].r.max_tokens) ||
                      (y->finish == CP_FINISH_STOP && y->n_ids <= (size_t)a[i].r.max_tokens),
                  "%s: request %d: %zu of %d tokens, finish %d", what, i, y->n_ids, a[i].r.max_tokens, (int)y->finish);
        cr_assert_eq(y->prompt_tokens, x->prompt_tokens);
        if (!plans) continue;
        cr_assert_eq(memcmp(y->plan, x->plan, (size_t)x->prompt_tokens), 0, "%s: request %d: another plan", what, i);
        cr_assert_eq(y->reused, x->reused);
        cr_assert_eq(y->segments_stored, x->segments_stored, "%s: request %d stored %d segments batched, %d alone", what, i,
                     y->segments_stored, x->segments_stored);
        cr_assert_eq(y->shared_stored, x->shared_stored);
    }
}

Test(batch, engine_none_same_as_alone, .timeout = TEST_TIMEOUT(120))
{
    world w;
    world_open(&w);
    cp_pool *pa, *pb;
    cp_engine *ea = engine(&w, CP_SHARE_NONE, &pa), *eb = engine(&w, CP_SHARE_NONE, &pb);
    req a[NREQ], b[NREQ];
    for (int i = 0; i < NREQ; i++) make_req(&a[i], i, i, (uint32_t)(i % 3), 0, "none"), make_req(&b[i], i, i, (uint32_t)(i % 3), 0, "none");
    run_alone(ea, a, NREQ);
    run_batched(eb, b, NREQ, 8, 32);
    expect_same(a, b, NREQ, 1, "none, 8 in flight");
    for (int i = 0; i < NREQ; i++) free_req(&a[i]), free_req(&b[i]);
    cp_engine_free(ea), cp_engine_free(eb);
    world_close(&w);
}

/* cacheprune over a pool warmed the same way on both sides and then not
 * changed (no-store requests): the plans are the same, so are the outputs */
Test(batch, engine_cacheprune_same_plan_same_output, .timeout = TEST_TIMEOUT(120))
{
    world w;
    world_open(&w);
    cp_pool *pa, *pb;
    cp_engine *ea = engine(&w, CP_SHARE_CACHEPRUNE, &pa), *eb = engine(&w, CP_SHARE_CACHEPRUNE, &pb);
    req warm_a[4], warm_b[4], a[NREQ], b[NREQ];
    for (int i = 0; i < 4; i++) make_req(&warm_a[i], i, i, (uint32_t)i, 0, "warm"), make_req(&warm_b[i], i, i, (uint32_t)i, 0, "warm");
    run_alone(ea, warm_a, 4);
    run_alone(eb, warm_b, 4);
    for (int i = 0; i < NREQ; i++) /* the warmed documents again, asked by other tenants too */
        make_req(&a[i], i, i % 5, (uint32_t)(i % 6), 1, "ask"), make_req(&b[i], i, i % 5, (uint32_t)(i % 6), 1, "ask");
    run_alone(ea, a, NREQ);
    run_batched(eb, b, NREQ, 8, 24);
    int hits = 0;
    for (int i = 0; i < NREQ; i++) hits += a[i].resp.reused;
    cr_assert(hits > 0, "the warmed pool served nothing: the test shows nothing");
    expect_same(a, b, NREQ, 1, "cacheprune, frozen pool");
    for (int i = 0; i < 4; i++) free_req(&warm_a[i]), free_req(&warm_b[i]);
    for (int i = 0; i < NREQ; i++) free_req(&a[i]), free_req(&b[i]);
    cp_engine_free(ea), cp_engine_free(eb);
    cp_pool_free(pa), cp_pool_free(pb);
    world_close(&w);
}

/* cacheprune storing, requests that cannot hit one another (own documents,
 * own tenants): batched they annotate from the batched attention export and
 * store what they store alone — a later request finds the same, down to
 * the recompute flags the annotator stored (the engines recompute by the
 * stored flags, so the probes' plans show them) */
Test(batch, engine_cacheprune_batched_export_stores_the_same, .timeout = TEST_TIMEOUT(120))
{
    world w;
    world_open(&w);
    cp_pool *pa, *pb;
    cp_engine *ea = engine_with(&w, CP_SHARE_CACHEPRUNE, CP_RECOMPUTE_PLAN, &pa), *eb = engine_with(&w, CP_SHARE_CACHEPRUNE, CP_RECOMPUTE_PLAN, &pb);
    enum { N = 6 };
    req a[N], b[N], pa_q[N], pb_q[N];
    for (int i = 0; i < N; i++)
        make_req(&a[i], i, 10 + i, (uint32_t)i, 0, "store"), make_req(&b[i], i, 10 + i, (uint32_t)i, 0, "store");
    run_alone(ea, a, N);
    run_batched(eb, b, N, 6, 40);
    int stored = 0;
    for (int i = 0; i < N; i++) stored += a[i].resp.shared_stored;
    cr_assert(stored > 0, "nothing was stored: the test shows nothing");
    expect_same(a, b, N, 1, "cacheprune, storing");
    for (int i = 0; i < N; i++) /* another tenant asks about each document, alone on both sides */
        make_req(&pa_q[i], i, 10 + i, 50, 1, "probe"), make_req(&pb_q[i], i, 10 + i, 50, 1, "probe");
    run_alone(ea, pa_q, N);
    run_alone(eb, pb_q, N);
    expect_same(pa_q, pb_q, N, 1, "probe after storing");
    for (int i = 0; i < N; i++) free_req(&a[i]), free_req(&b[i]), free_req(&pa_q[i]), free_req(&pb_q[i]);
    cp_engine_free(ea), cp_engine_free(eb);
    cp_pool_free(pa), cp_pool_free(pb);
    world_close(&w);
}
