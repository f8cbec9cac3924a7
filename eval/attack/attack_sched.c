/* Attacks on the order and timing of shared steps: scheduling (the probe of
 * eval/probe.h under FIFO and the LPM control) and batching (the attacker's
 * inter-token gaps while another tenant's request prefills beside it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attack.h"

/* The scheduling channel: a fresh engine per run of the probe. */
typedef struct sched_env {
    const att_opts *o;
    cp_model *m;
    cp_tokenizer *tok;
    cp_detect_chain *ch;
    const char *mode;
    att_engine es;
} sched_env;

static cp_status sched_open(void *ctx, cp_engine **e, cp_error *err)
{
    sched_env *s = ctx;
    if (!att_make_engine(s->o, s->m, s->tok, s->ch, s->mode, &s->es)) return cp_fail(err, CP_EINVAL, "attack: no engine for %s", s->mode);
    *e = s->es.e;
    return CP_OK;
}

static void sched_close(void *ctx, cp_engine *e)
{
    (void)e;
    att_drop_engine(&((sched_env *)ctx)->es);
}

/* both orders for one mode: FIFO (what serve and run use) and the LPM control */
int attack_sched(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_sched_result *out)
{
    sched_env se = { .o = o, .m = m, .tok = tok, .ch = ch, .mode = mode };
    cp_probe_env env = { .open = sched_open, .close = sched_close, .ctx = &se, .tok = tok };
    for (int i = 0; i < 2; i++) {
        cp_probe_opts po;
        cp_probe_opts_default(&po);
        po.trials = o->trials, po.candidates = o->cands;
        po.seed = att_rnd(o->rng) | (uint64_t)att_rnd(o->rng) << 32 | 1;
        po.order = i ? CP_SCHED_LPM_UNSAFE : CP_SCHED_FIFO;
        cp_error err = { 0 };
        out[i] = (att_sched_result){ .mode = mode, .order = i ? "lpm (control)" : "fifo" };
        if (cp_sched_probe(&env, &po, &out[i].r, &err)) return cli_error("attack: %s", err.msg), 0;
    }
    return 1;
}

/* ---- batching: the attacker's inter-token gaps beside another tenant's prefill ---- */

static double wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

enum { BATCH_LEAD = 3, BATCH_GAPS = 40 };

typedef struct gap_clock {
    double at[BATCH_LEAD + BATCH_GAPS + 1];
    int n;
} gap_clock;

static int on_token(void *ctx, const char *bytes, size_t n)
{
    (void)bytes, (void)n;
    gap_clock *g = ctx;
    if (g->n < BATCH_LEAD + BATCH_GAPS + 1) g->at[g->n++] = wall_ms();
    return 0;
}

static void count_done(void *ctx, void *user, cp_status rc, const cp_error *err)
{
    (void)user, (void)err;
    int *st = ctx;
    st[0]++;
    st[1] |= rc != CP_OK;
}

/* One trial: the attacker (tenant 2) primes `primed`; it decodes a long
 * answer while tenant 1's [doc][q] joins the batch (a hit when doc is what
 * was primed; the victim's request is the same in both cases, so only the
 * hit differs).  Returns the sum of the attacker's next BATCH_GAPS
 * inter-token gaps (ms), or < 0 on error. */
static double batching_trial(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, const char *primed,
                             const char *doc)
{
    att_engine es;
    if (!att_make_engine(o, m, tok, ch, mode, &es)) return -1;
    double t, sum = -1;
    int re;
    cp_batcher *b = NULL;
    cp_error err = { 0 };
    const cp_role roles[2] = { CP_ROLE_DOCUMENT, CP_ROLE_USER };
    const char *prime[2] = { primed, att_question };
    cp_batcher_opts bo = { .max_running = 2, .step_tokens = CP_BATCH_STEP_TOKENS_CPU, .prefill_tokens = CP_BATCH_PREFILL_TOKENS,
                           .kv_bytes = (size_t)256 << 20 };
    if (!att_ask_msgs(&es, 2, roles, prime, 2, 0, 0, &t, &re, NULL) || cp_batcher_create(es.e, &bo, &b, &err)) {
        if (err.msg[0]) cli_error("attack: %s", err.msg);
        att_drop_engine(&es);
        return -1;
    }
    static const char mine[] = "Tell me a long story about a lighthouse keeper and his dog.";
    cp_request_msg am = { CP_ROLE_USER, mine, sizeof mine - 1, 0, NULL, 0 };
    cp_request_msg vm[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 }, { CP_ROLE_USER, att_question, strlen(att_question), 0, NULL, 0 } };
    gap_clock g = { .n = 0 };
    cp_request ar = { .tenant = 2, .msgs = &am, .n_msgs = 1, .max_tokens = BATCH_LEAD + BATCH_GAPS + 1, .sampling = { .top_p = 1 },
                      .ignore_eos = 1, .on_piece = on_token, .piece_ctx = &g, .no_store = 1 };
    cp_request vr = { .tenant = 1, .msgs = vm, .n_msgs = 2, .max_tokens = 1, .sampling = { .top_p = 1 } };
    cp_response aresp = { 0 }, vresp = { 0 };
    uint64_t id;
    int st[2] = { 0, 0 }, submitted = 0;
    cp_status rc = cp_batcher_submit(b, &ar, &aresp, NULL, &id, &err);
    while (rc == CP_OK && cp_batcher_pending(b)) {
        /* the victim arrives once the attacker decodes: its prefill shares the attacker's steps */
        if (!submitted && g.n >= BATCH_LEAD) rc = cp_batcher_submit(b, &vr, &vresp, NULL, &id, &err), submitted = 1;
        if (rc == CP_OK) rc = cp_batcher_step(b, count_done, st, &err);
    }
    if (rc || st[1] || st[0] != 2 || g.n < BATCH_LEAD + BATCH_GAPS + 1) cli_error("attack: the batching trial failed%s%s", err.msg[0] ? ": " : "", err.msg);
    else sum = g.at[BATCH_LEAD + BATCH_GAPS] - g.at[BATCH_LEAD];
    cp_batcher_free(b); /* finishes what it still holds */
    cp_response_free(&aresp), cp_response_free(&vresp);
    att_drop_engine(&es);
    return sum;
}

int attack_batching(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_batch_result *out)
{
    size_t n = strlen(att_poison_docs[1]) + strlen(att_poison_docs[2]) + 2;
    char *pub = malloc(n), *other = malloc(n);
    int T = o->trials * o->repeats, ok = pub && other;
    double *hit = malloc((size_t)T * sizeof *hit), *miss = malloc((size_t)T * sizeof *miss);
    if (!ok || !hit || !miss) ok = 0, cli_error("attack: out of memory");
    if (ok) {
        snprintf(pub, n, "%s %s", att_poison_docs[1], att_poison_docs[2]);
        /* what the attacker primes when it guesses wrong: the same words, every 'e' an 'a' */
        for (size_t i = 0; i < n; i++) other[i] = pub[i] == 'e' ? 'a' : pub[i];
    }
    for (int i = 0; i < T && ok; i++) { /* interleaved: hit, miss, hit, ... */
        hit[i] = batching_trial(o, m, tok, ch, mode, pub, pub);
        miss[i] = batching_trial(o, m, tok, ch, mode, other, pub);
        ok = hit[i] >= 0 && miss[i] >= 0;
    }
    if (ok) {
        double wins = 0;
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) wins += miss[j] > hit[i] ? 1 : miss[j] == hit[i] ? 0.5 : 0;
        *out = (att_batch_result){ .mode = mode, .auc = wins / ((double)T * T), .trials = T };
        out->hit_ms = att_median(hit, T), out->miss_ms = att_median(miss, T);
    }
    free(pub), free(other), free(hit), free(miss);
    return ok;
}
