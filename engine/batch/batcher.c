/* Continuous batching over an engine (see batcher.h). */
#include "batcher.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/clock.h"

/* One request the batcher holds. */
typedef struct slot {
    cp_job *job;
    void *user;
    cp_status rc; /* its first error; it retires at the end of that step */
    cp_error err;
} slot;

struct cp_batcher {
    cp_engine *e;
    cp_model *m;
    cp_sched *sched;
    cp_batch_ws *ws;
    cp_sched_step step;
    cp_batch_seq *seqs;
    int *seq_work; /* the work item of each sequence */
    uint8_t *finished;
    int cap;       /* entries of the three above */
    cp_batcher_stats stats;
    long long kv_slots; /* the KV budget in slots (fixed at creation) */
    cp_batcher_policy policy; /* order NULL: none registered */
};

/* A registered policy (batcher.h) seen through the scheduler's: the
 * waiting requests as the caller knows them (its pointer, the job); the
 * ids it hands back are the scheduler's new order. */
static cp_status policy_order(void *ctx, cp_sched_waiting *w, size_t n, cp_error *err)
{
    cp_batcher *b = ctx;
    cp_batcher_waiting *bw = cp_malloc(n * sizeof *bw, "batcher policy", err);
    if (!bw) return CP_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const slot *sl = w[i].user;
        bw[i] = (cp_batcher_waiting){ .id = w[i].id, .user = sl->user, .job = sl->job };
    }
    cp_status rc = b->policy.order(b->policy.ctx, bw, n, err);
    for (size_t i = 0; rc == CP_OK && i < n; i++) w[i].id = bw[i].id;
    free(bw);
    return rc;
}

cp_status cp_batcher_create(cp_engine *e, const cp_batcher_opts *o, cp_batcher **out, cp_error *err)
{
    *out = NULL;
    cp_model *m = cp_engine_model(e);
    const cp_config *c = &m->cfg;
    size_t slot_bytes = (size_t)3 * c->n_layers * c->n_kv_heads * c->head_dim * sizeof(float);
    cp_sched_opts so = { .step_tokens = o->step_tokens, .prefill_tokens = o->prefill_tokens, .max_running = o->max_running,
                         .kv_budget = (long long)(o->kv_bytes / slot_bytes),
                         .prefill_many = !cp_engine_pool(e) && !o->serial_prefill, .prefill_by_tenant = o->prefill_by_tenant };
    cp_batcher *b = cp_calloc(1, sizeof *b, "batcher", err);
    if (!b) return CP_ENOMEM;
    b->e = e, b->m = m, b->kv_slots = so.kv_budget;
    if (o->policy && o->policy->order) b->policy = *o->policy, so.policy = (cp_sched_policy){ policy_order, b };
    cp_status rc = cp_sched_create(&so, &b->sched, err);
    int ws_tokens = o->prefill_tokens > o->step_tokens ? o->prefill_tokens : o->step_tokens;
    if (rc == CP_OK) rc = cp_batch_ws_create(m, ws_tokens, &b->ws, err);
    if (rc) {
        cp_batcher_free(b);
        return cp_fail_wrap(err, "batcher: %d requests in flight, %d tokens a step, %zu KV bytes", o->max_running, o->step_tokens,
                            o->kv_bytes);
    }
    *out = b;
    return CP_OK;
}

static cp_status finish(slot *sl)
{
    cp_status rc = cp_job_finish(sl->job, sl->rc, &sl->err);
    sl->job = NULL;
    return rc;
}

void cp_batcher_free(cp_batcher *b)
{
    if (!b) return;
    if (b->sched && cp_sched_pending(b->sched)) { /* whatever is still held: cancelled, retired, freed */
        cp_error err = { 0 };
        cp_sched_step st = { 0 };
        cp_sched_cancel_all(b->sched);
        cp_status rc = cp_sched_next(b->sched, &st, &err); /* retires every cancelled request */
        for (int k = 0; rc == CP_OK && k < st.n_retired; k++) {
            slot *sl = st.retired[k];
            sl->rc = cp_fail(&sl->err, CP_EINVAL, "batcher: shut down before the request finished");
            finish(sl);
            free(sl);
        }
        cp_sched_step_free(&st);
    }
    cp_sched_free(b->sched);
    cp_batch_ws_free(b->m, b->ws);
    cp_sched_step_free(&b->step);
    free(b->seqs), free(b->seq_work), free(b->finished);
    free(b);
}

cp_status cp_batcher_submit_job(cp_batcher *b, cp_job *job, const cp_request *req, void *user, uint64_t *id, cp_error *err)
{
    slot *sl = cp_calloc(1, sizeof *sl, "batcher request", err);
    if (!sl) {
        cp_job_finish(job, CP_ENOMEM, NULL);
        return CP_ENOMEM;
    }
    sl->user = user, sl->job = job;
    cp_status rc = cp_sched_submit(b->sched, req->tenant, cp_job_prompt_tokens(job), req->max_tokens, sl, id, err);
    if (rc) {
        cp_job_finish(job, rc, NULL);
        free(sl);
    }
    return rc;
}

cp_status cp_batcher_submit(cp_batcher *b, const cp_request *req, cp_response *resp, void *user, uint64_t *id, cp_error *err)
{
    cp_job *job = NULL;
    cp_status rc = cp_job_create(b->e, req, resp, &job, err);
    return rc ? rc : cp_batcher_submit_job(b, job, req, user, id, err);
}

int cp_batcher_cancel(cp_batcher *b, uint64_t id) { return cp_sched_cancel(b->sched, id); }

size_t cp_batcher_pending(const cp_batcher *b) { return cp_sched_pending(b->sched); }

int cp_batcher_room(const cp_batcher *b, int prompt_tokens)
{
    const long long room = b->kv_slots - prompt_tokens;
    return room <= 0 ? 0 : room > INT_MAX ? INT_MAX : (int)room;
}

int cp_batcher_fits(const cp_batcher *b, int prompt_tokens, int max_tokens)
{
    return (long long)prompt_tokens + max_tokens <= b->kv_slots; /* cp_sched_submit's refusal */
}

void cp_batcher_stats_get(const cp_batcher *b, cp_batcher_stats *out) { *out = b->stats; }

/* The step's figures; returns whether it carries prefill work. */
static int count_step(cp_batcher_stats *s, const cp_sched_step *st, const cp_batch_seq *seqs, int nq)
{
    int prefills = 0;
    s->steps++;
    s->seqs += (uint64_t)nq;
    int tokens = 0;
    for (int q = 0; q < nq; q++) tokens += seqs[q].n;
    s->tokens += (uint64_t)tokens;
    for (int j = 0; j < st->n_work; j++) { /* as planned: a reused prefix counts as the prefill it replaced */
        if (st->work[j].kind == CP_SCHED_DECODE) s->decode_tokens++;
        else s->prefill_tokens += (uint64_t)st->work[j].n, prefills = 1;
    }
    s->last_seqs = nq;
    if (nq > s->max_seqs) s->max_seqs = nq;
    if (tokens > s->max_tokens) s->max_tokens = tokens;
    return prefills;
}

static cp_status room(cp_batcher *b, int n, cp_error *err)
{
    if (n <= b->cap && b->cap) return CP_OK;
    int c = n < 64 ? 64 : n;
    free(b->seqs), free(b->seq_work), free(b->finished);
    b->seqs = cp_malloc((size_t)c * sizeof *b->seqs, "batch sequences", err);
    b->seq_work = cp_malloc((size_t)c * sizeof *b->seq_work, "batch sequences", err);
    b->finished = cp_malloc((size_t)c, "batch sequences", err);
    b->cap = b->seqs && b->seq_work && b->finished ? c : 0;
    return b->cap ? CP_OK : CP_ENOMEM;
}

/* Hands retired requests [from, n_retired) back: each finished, its callback. */
static void hand_back(cp_batcher *b, int from, cp_batcher_done done, void *ctx)
{
    for (int k = from; k < b->step.n_retired; k++) {
        slot *sl = b->step.retired[k];
        cp_status rc = finish(sl);
        if (done) done(ctx, sl->user, rc, &sl->err);
        free(sl);
    }
}

static void fail(slot *sl, cp_status rc, const cp_error *err)
{
    if (sl->rc) return;
    sl->rc = rc;
    sl->err = *err;
}

static cp_status step(cp_batcher *b, cp_batcher_done done, void *ctx, double *fwd_s, cp_error *err)
{
    cp_sched_step *st = &b->step;
    cp_status rc = cp_sched_next(b->sched, st, err);
    if (rc) return rc;
    for (int k = 0; k < st->n_retired; k++) { /* cancelled */
        slot *sl = st->retired[k];
        cp_error ce = { 0 };
        cp_fail(&ce, CP_EINVAL, "request cancelled");
        fail(sl, CP_EINVAL, &ce);
    }
    hand_back(b, 0, done, ctx);
    int planned = st->n_retired;
    if ((rc = room(b, st->n_work, err))) return rc;
    int nq = 0;
    memset(b->finished, 0, (size_t)st->n_work);
    for (int j = 0; j < st->n_work; j++) {
        const cp_sched_work *w = &st->work[j];
        slot *sl = w->user;
        cp_error je = { 0 };
        cp_status jr = CP_OK;
        if (w->kind == CP_SCHED_PREFILL) {
            if (w->first) jr = cp_job_begin(sl->job, &je);
            if (jr == CP_OK && cp_job_prefill_seq(sl->job, w->from, w->n, w->last, &b->seqs[nq]) > 0) b->seq_work[nq++] = j;
        } else {
            cp_job_decode_seq(sl->job, &b->seqs[nq]);
            b->seq_work[nq++] = j;
        }
        if (jr) fail(sl, jr, &je), b->finished[j] = 1;
    }
    if (nq) {
        int prefills = count_step(&b->stats, st, b->seqs, nq);
        cp_error fe = { 0 };
        double t0 = cp_now_s();
        cp_status fr = cp_forward_batch(b->m, b->ws, b->seqs, nq, &fe);
        *fwd_s = cp_now_s() - t0;
        if (prefills) b->stats.prefill_steps++, b->stats.prefill_forward_s += *fwd_s;
        if (fr) { /* the step's requests fail together: their KV is in an unknown state */
            for (int q = 0; q < nq; q++) fail(st->work[b->seq_work[q]].user, fr, &fe), b->finished[b->seq_work[q]] = 1;
        }
    }
    for (int j = 0; j < st->n_work; j++) {
        const cp_sched_work *w = &st->work[j];
        slot *sl = w->user;
        if (sl->rc) {
            b->finished[j] = 1;
            continue;
        }
        int fin = 0;
        cp_error je = { 0 };
        cp_status jr = CP_OK;
        if (w->kind == CP_SCHED_DECODE) jr = cp_job_decoded(sl->job, &fin, &je);
        else if (w->last) jr = cp_job_first_token(sl->job, &fin, &je);
        if (jr) fail(sl, jr, &je), fin = 1;
        b->finished[j] = (uint8_t)fin;
    }
    if ((rc = cp_sched_end(b->sched, st, b->finished, err))) return rc;
    hand_back(b, planned, done, ctx);
    return CP_OK;
}

cp_status cp_batcher_step(cp_batcher *b, cp_batcher_done done, void *ctx, cp_error *err)
{
    double t0 = cp_now_s(), fwd = 0;
    cp_status rc = step(b, done, ctx, &fwd, err);
    b->stats.forward_s += fwd;
    b->stats.host_s += cp_now_s() - t0 - fwd;
    return rc;
}
