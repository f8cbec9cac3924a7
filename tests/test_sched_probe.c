/* The scheduling channel (THREAT_MODEL.md): admission under FIFO never reads
 * what the cache holds, and the probe (eval/probe.h) sees that —
 * model-free through the step scheduler, with the LPM control's sort as a
 * registered policy and without one (FIFO: nothing asked), then end to end
 * on cp-books-6m through the batcher: under the
 * LPM control in global-prefix the true candidate jumps the queue every
 * trial, under FIFO (global-prefix and cacheprune) every request of the
 * burst finishes at the same step whether the victim's secret is the true
 * candidate or a decoy, so nothing the attacker computes from steps can
 * beat chance. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../eval/probe.h"
#include "helpers.h"

/* ---- model-free: the order of first prefill chunks ---- */

typedef struct oracle {
    int calls;
    const int *hits; /* by request index */
    int broken;      /* 1: hand back an id twice */
} oracle;

/* The LPM control's order as a scheduler policy: the hits of each waiting
 * request (by its index), sorted by the probe's own sort. */
static cp_status order_by_hits(void *ctx, cp_sched_waiting *w, size_t n, cp_error *err)
{
    (void)err;
    oracle *o = ctx;
    o->calls++;
    cp_batcher_waiting bw[8];
    int hits[8];
    cr_assert_leq(n, 8);
    for (size_t i = 0; i < n; i++) bw[i] = (cp_batcher_waiting){ .id = w[i].id, .user = w[i].user }, hits[i] = o->hits[*(const int *)w[i].user];
    cp_probe_sort_by_hits(bw, hits, n);
    for (size_t i = 0; i < n; i++) w[i].id = bw[i].id;
    if (o->broken && n > 1) w[1].id = w[0].id;
    return CP_OK;
}

/* Six requests of one length queued at once, one runs at a time: the order
 * their first chunks come in (the policy registered when lpm is set). */
static void first_chunk_order(int lpm, oracle *orc, int *got)
{
    cp_error err = { 0 };
    cp_sched *s = NULL;
    cp_sched_opts o = { .step_tokens = 8, .kv_budget = 1000, .max_running = 1 };
    if (lpm) o.policy = (cp_sched_policy){ order_by_hits, orc };
    cr_assert_eq(cp_sched_create(&o, &s, &err), CP_OK, "%s", err.msg);
    static const int idx[6] = { 0, 1, 2, 3, 4, 5 };
    for (int i = 0; i < 6; i++) cr_assert_eq(cp_sched_submit(s, (uint32_t)i, 5, 1, (void *)&idx[i], NULL, &err), CP_OK);
    cp_sched_step st = { 0 };
    int n = 0;
    for (int step = 0; step < 100 && cp_sched_pending(s); step++) {
        cr_assert_eq(cp_sched_next(s, &st, &err), CP_OK, "%s", err.msg);
        for (int j = 0; j < st.n_work; j++)
            if (st.work[j].kind == CP_SCHED_PREFILL && st.work[j].first) got[n++] = *(const int *)st.work[j].user;
        cr_assert_eq(cp_sched_end(s, &st, NULL, &err), CP_OK, "%s", err.msg);
    }
    cr_assert_eq(n, 6, "all six ran");
    cp_sched_step_free(&st);
    cp_sched_free(s);
}

/* Without a registered policy (serve, run) the oracle that would reorder
 * everything (later = more hits) is never asked: arrival order exactly. */
Test(sched_probe, fifo_never_reads_hits)
{
    static const int hits[6] = { 0, 10, 20, 30, 40, 50 };
    oracle orc = { 0, hits, 0 };
    int got[6];
    first_chunk_order(0, &orc, got);
    cr_assert_eq(orc.calls, 0, "FIFO admission asked the hit oracle %d times", orc.calls);
    for (int i = 0; i < 6; i++) cr_assert_eq(got[i], i, "position %d: request %d (arrival order broken)", i, got[i]);
}

/* The control orders by hits, longest first, arrival order among equals:
 * hits 5 0 9 5 9 0 -> 2 4 0 3 1 5. */
Test(sched_probe, lpm_control_longest_first_ties_by_arrival)
{
    static const int hits[6] = { 5, 0, 9, 5, 9, 0 };
    static const int want[6] = { 2, 4, 0, 3, 1, 5 };
    oracle orc = { 0, hits, 0 };
    int got[6];
    first_chunk_order(1, &orc, got);
    cr_assert_gt(orc.calls, 0);
    for (int i = 0; i < 6; i++) cr_assert_eq(got[i], want[i], "position %d: request %d, want %d", i, got[i], want[i]);
}

/* A policy that hands back anything but a permutation of the waiting ids
 * fails the step, with nobody lost or admitted twice. */
Test(sched_probe, a_policy_that_loses_a_request_fails_the_step)
{
    static const int hits[3] = { 1, 2, 3 }, idx[3] = { 0, 1, 2 };
    oracle orc = { 0, hits, 1 };
    cp_error err = { 0 };
    cp_sched *s = NULL;
    cp_sched_opts o = { .step_tokens = 8, .kv_budget = 100, .max_running = 1, .policy = { order_by_hits, &orc } };
    cr_assert_eq(cp_sched_create(&o, &s, &err), CP_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) cr_assert_eq(cp_sched_submit(s, 0, 4, 1, (void *)&idx[i], NULL, &err), CP_OK);
    cp_sched_step st = { 0 };
    cr_assert_eq(cp_sched_next(s, &st, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "policy"), "%s", err.msg);
    cr_assert_eq(cp_sched_pending(s), 3, "the failed step lost or admitted a request");
    cr_assert_eq(cp_sched_running(s), 0);
    cp_sched_step_free(&st);
    cp_sched_free(s);
}

/* ---- end to end: the probe through the batcher on cp-books-6m ---- */

typedef struct world {
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    cp_detect_chain chain;
    cp_sharing mode;
    cp_pool *pool;
} world;

static cp_status open_engine(void *ctx, cp_engine **e, cp_error *err)
{
    world *w = ctx;
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.sharing = w->mode;
    cp_kv_layout l;
    cp_engine_kv_layout(w->m, &l);
    cp_pool_opts po;
    cp_pool_opts_default(&po);
    po.budget_bytes = (size_t)64 << 20;
    cp_status rc = cp_pool_create(&l, w->be, &po, &w->pool, err);
    if (rc == CP_OK) rc = cp_engine_create(w->m, w->tok, w->pool, &w->chain, &o, e, err);
    return rc;
}

static void close_engine(void *ctx, cp_engine *e)
{
    world *w = ctx;
    cp_engine_free(e);
    cp_pool_free(w->pool);
    w->pool = NULL;
}

static cp_probe_result probe(cp_sharing mode, cp_sched_order order)
{
    world w = { .mode = mode };
    char dir[512];
    w.m = load_model_or_die(shared_path(dir, sizeof dir, "models/cp-books-6m"), &w.be);
    w.tok = open_tokenizer_or_die("models/cp-books-6m");
    cp_error err = { 0 };
    cp_detector *d;
    cp_chain_init(&w.chain);
    cr_assert_eq(cp_detector_builtin(&d, &err), CP_OK);
    cr_assert_eq(cp_chain_add(&w.chain, d, &err), CP_OK);
    cp_probe_env env = { .open = open_engine, .close = close_engine, .ctx = &w, .tok = w.tok };
    cp_probe_opts po;
    cp_probe_opts_default(&po);
    po.trials = 2, po.candidates = 4, po.order = order;
    cp_probe_result r;
    cr_assert_eq(cp_sched_probe(&env, &po, &r, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(r.trials, 2);
    cr_assert_float_eq(r.chance, 0.25, 1e-12);
    cp_chain_free(&w.chain);
    cp_tokenizer_free(w.tok);
    cp_model_free(w.m);
    cp_backend_destroy(w.be);
    return r;
}

Test(sched_probe, lpm_control_recovers_the_hit, .timeout = TEST_TIMEOUT(60))
{
    cp_probe_result r = probe(CP_SHARE_GLOBAL_PREFIX, CP_SCHED_LPM_UNSAFE);
    cr_assert_float_eq(r.by_steps, 1.0, 1e-12, "the true candidate should finish first every trial: %.2f", r.by_steps);
    cr_assert_eq(r.same_trace, 0, "the secret should move the step trace: %d of 2 trials unchanged", r.same_trace);
}

Test(sched_probe, fifo_global_prefix_steps_carry_nothing, .timeout = TEST_TIMEOUT(60))
{
    cp_probe_result r = probe(CP_SHARE_GLOBAL_PREFIX, CP_SCHED_FIFO);
    cr_assert_eq(r.same_trace, 2, "a hit moved another request's step under FIFO: %d of 2 trials unchanged", r.same_trace);
}

Test(sched_probe, fifo_cacheprune_at_chance, .timeout = TEST_TIMEOUT(60))
{
    cp_probe_result r = probe(CP_SHARE_CACHEPRUNE, CP_SCHED_FIFO);
    cr_assert_eq(r.same_trace, 2, "%d of 2 trials unchanged", r.same_trace);
}
