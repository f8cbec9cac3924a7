#include "sched.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/clock.h"
#include "../../kernels/log.h"
#include "../batch/batcher.h"
#include "pacer.h"

/* One job in flight in the batcher: the request and response the batcher
 * reads and writes until its done callback (so they never move). */
typedef struct flight {
    srv_job *j;             /* NULL: a free entry */
    cp_request req;
    cp_response resp;
    uint64_t id;            /* the batcher's */
    double t_start_ms;
    int cancel_sent;
    /* handed to the preparing thread (cp_job_create: render, tokenize,
     * detect) and not yet back: the engine thread reads none of req, resp
     * and the fields below meanwhile */
    int preparing;
    int cancel_pending;     /* its client left while it was prepared: cancelled once in the batcher */
    cp_job *job;            /* made by the preparing thread */
    cp_status prep_rc;
    cp_error prep_err;
    struct flight *next;    /* in the preparing thread's queue, then the ready list */
} flight;

struct srv_sched {
    srv_engine eng;
    srv_metrics *metrics;
    srv_queue *queue;    /* the one queue (queue.h) */
    pthread_t thread;
    /* the engine thread's own (no lock) */
    cp_batcher *batcher;
    flight *fl;          /* [eng.concurrency] */
    int n_fl;
    double admit_s, idle_s; /* the engine thread's time taking jobs, waiting (/metrics) */
    srv_pacer pacer;        /* admission takes turns with the steps (pacer.h) */
    int n_preparing;        /* flights handed to the preparing thread and not taken back */
    /* The preparing thread: detection (the NER plugin: milliseconds a
     * message, ~100 characters a millisecond) off the engine thread, so
     * the requests in flight keep decoding while a new one's prompt is
     * scanned.  It alone uses the engine's detector chain; the memo it
     * shares with a purge holds its own lock. */
    pthread_t prep;
    int prep_started, prep_stop;
    pthread_mutex_t prep_mu;
    pthread_cond_t prep_cv;
    flight *handed, *handed_tail; /* to prepare, in the order taken */
    flight *ready, *ready_tail;   /* prepared, for the engine thread */
    uint64_t chain_failures, chain_messages; /* the chain's counts after the last job prepared */
};

/* The engine's answer into the job, under its lock. */
static void finish_job(srv_sched *s, srv_job *j, cp_status rc, const cp_error *err, const cp_response *resp)
{
    cp_response view;
    cp_response_tenant_view(resp, s->eng.report_reuse, &view);
    pthread_mutex_lock(&j->mu);
    if (rc == CP_OK && j->rc == CP_OK) {
        cp_error e;
        if ((rc = srv_text_finish(&j->text, resp->text, &e))) j->rc = rc, memcpy(j->err, e.msg, sizeof j->err);
        j->prompt_tokens = resp->prompt_tokens;
        j->completion_tokens = (int)resp->n_ids;
        j->cached_tokens = view.reused;
        /* the engine says why it ended; a stop sequence is the server's own */
        j->finish = j->text.stopped || resp->finish == CP_FINISH_STOP ? "stop" : "length";
    } else if (j->rc == CP_OK) {
        j->rc = rc;
        memcpy(j->err, err->msg, sizeof j->err);
    }
    j->state = SRV_JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void publish(srv_sched *s, const cp_response *resp, cp_status rc, double wait_ms)
{
    if (rc == CP_OK)
        srv_metrics_request(s->metrics, resp->prompt_tokens, resp->computed, resp->reused, resp->recomputed, (int)resp->n_ids,
                            (wait_ms + resp->ttft_ms) / 1e3);
    cp_pool_stats ps = { 0 };
    if (s->eng.pool) cp_pool_stats_get(s->eng.pool, &ps);
    srv_metrics_pins(s->metrics, ps.pinned_blocks);
    srv_metrics_pool_events(s->metrics, ps.evictions_lru + ps.evictions_gdsf + ps.evictions_ttl + ps.evictions_bucket, ps.quota_refusals);
    pthread_mutex_lock(&s->prep_mu); /* the chain is the preparing thread's: its counts as it left them */
    const uint64_t failures = s->chain_failures, messages = s->chain_messages;
    pthread_mutex_unlock(&s->prep_mu);
    srv_metrics_state(s->metrics, ps.bytes_used, ps.bytes_budget, ps.segments, failures, messages);
}

/* Erasure, on the engine thread between steps, once none of the tenant's
 * jobs is in flight: none holds a pin on its private segments (other
 * tenants' jobs can only pin their own and shared ones). */
static void run_purge(srv_sched *s, srv_job *j)
{
    size_t segs, adm;
    long tier = 0;
    cp_engine_purge_tenant(s->eng.engine, j->purge_tenant, &segs, &adm, &tier);
    srv_metrics_purge(s->metrics, segs);
    cp_response none = { 0 };
    publish(s, &none, CP_EIO, 0); /* the pool's figures, no request's */
    pthread_mutex_lock(&j->mu);
    j->purged_segments = segs, j->purged_admissions = adm;
    j->purged_tiered = s->metrics->tier != NULL, j->purged_tier = tier;
    j->state = SRV_JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    cp_debug("serve: purge of tenant %u: %zu segments, %zu admission records", j->purge_tenant, segs, adm);
}

/* The batcher's figures to /metrics. */
static void publish_batch(srv_sched *s)
{
    cp_batcher_stats bs;
    cp_batcher_stats_get(s->batcher, &bs);
    srv_metrics_batch(s->metrics, bs.steps, bs.seqs, bs.max_seqs);
    srv_engine_time t = { .prefill_tokens = bs.prefill_tokens, .decode_tokens = bs.decode_tokens, .max_tokens = bs.max_tokens,
                          .forward_s = bs.forward_s, .step_other_s = bs.host_s, .admit_s = s->admit_s, .idle_s = s->idle_s,
                          .prefill_steps = bs.prefill_steps, .prefill_forward_s = bs.prefill_forward_s };
    srv_metrics_engine_time(s->metrics, &t);
}

/* A job's outcome (done by the batcher, or refused by it at submission):
 * figures, its slot, its answer, and its flight entry free again. */
static void complete(srv_sched *s, flight *f, cp_status rc, const cp_error *err)
{
    srv_job *j = f->j;
    const srv_gen *g = &j->gen;
    cp_response *resp = &f->resp;
    /* the figures first: once the client has its answer, /metrics counts it */
    if (g->no_store) srv_metrics_no_store(s->metrics);
    srv_metrics_itl(s->metrics, &j->itl); /* the engine is done with the job: no lock needed for itl */
    if (srv_job_cancelled(j)) srv_metrics_cancelled(s->metrics, 0);
    publish(s, resp, rc, f->t_start_ms - j->t_submit_ms);
    publish_batch(s);
    s->n_fl--;
    srv_metrics_running(s->metrics, (size_t)s->n_fl); /* before the answer, like every figure */
    srv_queue_release(s->queue, j); /* the tenant's slot back before its answer */
    finish_job(s, j, rc, err, resp);
    /* the operator's log: figures, never text */
    cp_debug("serve: tenant %u: %d prompt tokens, %d computed, %d reused, %zu generated, queue %.1f ms, ttft %.1f ms%s", j->tenant,
             resp->prompt_tokens, resp->computed, resp->reused, resp->n_ids, f->t_start_ms - j->t_submit_ms, resp->ttft_ms,
             rc ? " (error)" : "");
    cp_response_free(resp);
    f->j = NULL;
    srv_queue_done(s->queue, j);
}

static void batch_done(void *ctx, void *user, cp_status rc, const cp_error *err)
{
    complete(ctx, user, rc, err);
}

/* The engine's request for a parsed generation (no callbacks yet). */
static cp_request request_of(const srv_gen *g, uint32_t tenant)
{
    return (cp_request){ .tenant = tenant, .msgs = g->msgs, .n_msgs = g->n_msgs, .max_tokens = g->max_tokens,
                         .sampling = g->sampling, .no_store = g->no_store };
}

/* f at the end of the list head .. tail (under prep_mu) */
static void append(flight **head, flight **tail, flight *f)
{
    if (*tail) (*tail)->next = f;
    else *head = f;
    *tail = f;
}

/* A taken job to the preparing thread (the queue started it: RUNNING): it
 * holds its place in flight from now on. */
static void start_job(srv_sched *s, srv_job *j)
{
    flight *f = s->fl;
    while (f->j) f++; /* a free one: fewer than concurrency are in flight */
    *f = (flight){ .j = j, .t_start_ms = cp_now_ms(), .preparing = 1 };
    f->req = request_of(&j->gen, j->tenant);
    f->req.on_piece = srv_job_on_piece, f->req.piece_ctx = j, f->req.cancelled = srv_job_cancelled;
    s->n_fl++, s->n_preparing++;
    srv_metrics_running(s->metrics, (size_t)s->n_fl);
    pthread_mutex_lock(&s->prep_mu);
    append(&s->handed, &s->handed_tail, f);
    pthread_cond_signal(&s->prep_cv);
    pthread_mutex_unlock(&s->prep_mu);
}

/* The preparing thread: each handed job rendered, tokenized and detected
 * (cp_job_create), in order, onto the ready list; the engine thread woken */
static void *prep_thread(void *arg)
{
    srv_sched *s = arg;
    pthread_mutex_lock(&s->prep_mu);
    for (;;) {
        while (!s->handed && !s->prep_stop) pthread_cond_wait(&s->prep_cv, &s->prep_mu);
        flight *f = s->handed;
        if (!f) break; /* stopping with nothing handed */
        s->handed = f->next;
        if (!s->handed) s->handed_tail = NULL;
        f->next = NULL;
        pthread_mutex_unlock(&s->prep_mu);
        f->prep_err = (cp_error){ 0 };
        f->prep_rc = cp_job_create(s->eng.engine, &f->req, &f->resp, &f->job, &f->prep_err);
        pthread_mutex_lock(&s->prep_mu);
        if (s->eng.chain) s->chain_failures = s->eng.chain->failures, s->chain_messages = s->eng.chain->messages;
        append(&s->ready, &s->ready_tail, f);
        pthread_mutex_unlock(&s->prep_mu);
        srv_queue_kick(s->queue);
        pthread_mutex_lock(&s->prep_mu);
    }
    pthread_mutex_unlock(&s->prep_mu);
    return NULL;
}

/* The prepared jobs into the batcher, in the order they were taken; one
 * that failed to prepare, or that the batcher refuses, is answered at once
 * (the admission check, before the queue, leaves it only what needs the
 * engine: out of memory, say). */
static void take_prepared(srv_sched *s)
{
    pthread_mutex_lock(&s->prep_mu);
    flight *f = s->ready;
    s->ready = s->ready_tail = NULL;
    pthread_mutex_unlock(&s->prep_mu);
    while (f) {
        flight *next = f->next;
        f->next = NULL, f->preparing = 0;
        s->n_preparing--;
        cp_error err = f->prep_err;
        cp_status rc = f->prep_rc;
        if (rc == CP_OK) rc = cp_batcher_submit_job(s->batcher, f->job, &f->req, f, &f->id, &err);
        f->job = NULL;
        srv_metrics_engine_took(s->metrics, rc != CP_OK);
        if (rc) {
            complete(s, f, rc, &err);
        } else if (f->cancel_pending) { /* never sent: a flight being prepared is not in the batcher */
            cp_batcher_cancel(s->batcher, f->id);
            f->cancel_sent = 1;
        }
        f = next;
    }
}

static int tenant_in_flight(const srv_sched *s, uint32_t tenant)
{
    for (int k = 0; k < s->eng.concurrency; k++)
        if (s->fl[k].j && s->fl[k].j->tenant == tenant) return 1;
    return 0;
}

/* May this queued job start now (srv_queue_take)?  A purge once none of
 * its tenant's jobs is in flight (meanwhile the other tenants' jobs pass
 * it).  A generation while fewer than concurrency are in flight, and the
 * last free place only for a tenant with nothing in flight: a tenant
 * holding every other place waits for one of its own to end, while
 * another tenant's request starts at once (not behind the first tenant's
 * long generations). */
static int may_start(void *ctx, const srv_job *j)
{
    srv_sched *s = ctx;
    if (j->purge) return tenant_in_flight(s, j->purge_tenant) ? SRV_MAY_WAIT_TENANT : SRV_MAY_START;
    if (s->n_fl >= s->eng.concurrency) return SRV_MAY_WAIT;
    if (s->n_fl == s->eng.concurrency - 1 && s->n_fl > 0 && tenant_in_flight(s, j->tenant)) return SRV_MAY_WAIT_TENANT;
    return SRV_MAY_START;
}

/* Takes queued jobs in the queue's order while they may start (one only when
 * `one`).  One round takes only the jobs queued when it began: a job the
 * batcher refuses at once frees its place in flight, and without that bound
 * a stream of such jobs arriving as fast as they are refused would keep the
 * round going and the steps of the requests in flight from ever running. */
static int admit(srv_sched *s, int one)
{
    size_t round = SIZE_MAX; /* set at the first look at the queue */
    srv_job *j;
    int n = 0;
    while ((j = srv_queue_take(s->queue, &round, may_start, s))) {
        n++;
        if (j->purge) {
            run_purge(s, j);
            srv_queue_done(s->queue, j);
        } else {
            start_job(s, j);
        }
        if (one) break;
    }
    return n;
}

/* The jobs in flight whose clients left (the queue hands them over): one
 * with no token yet (waiting in the batch for KV room, or prefilling)
 * leaves the batcher at the next step, having stored nothing, pins released
 * as it retires.  One already streaming stops at its next token through
 * on_piece, in the next step as well, and keeps its figures (tokens
 * generated) for /metrics. */
static void cancel_gone(srv_sched *s)
{
    srv_job *j;
    while ((j = srv_queue_next_cancelled(s->queue))) {
        for (int k = 0; k < s->eng.concurrency; k++) {
            flight *f = &s->fl[k];
            if (f->j == j && f->preparing) {
                f->cancel_pending = 1; /* not in the batcher yet */
            } else if (f->j == j && !f->cancel_sent && srv_job_wait_ms(j, SRV_JOB_STREAMING, 0) < SRV_JOB_STREAMING) {
                cp_batcher_cancel(s->batcher, f->id);
                f->cancel_sent = 1;
            }
        }
        srv_job_unref(j);
    }
}

/* A step failed as a whole (its jobs were answered with its error by the
 * batcher); the engine thread goes on with the next. */
static void step(srv_sched *s)
{
    cp_error err = { 0 };
    if (cp_batcher_step(s->batcher, batch_done, s, &err)) cp_warn("serve: a batch step failed: %s", err.msg);
    publish_batch(s);
}

static void *engine_thread(void *arg)
{
    srv_sched *s = arg;
    for (;;) {
        const uint64_t seen = srv_queue_events(s->queue); /* before taking: a kick after this wakes the wait below */
        take_prepared(s);
        /* while requests are in flight, one job at a time and paced
         * (pacer.h): whatever admission costs the engine thread, the
         * others' tokens keep at least half of it, and at most one new job
         * comes between two of their steps */
        const int busy = cp_batcher_pending(s->batcher) != 0;
        if (srv_pacer_may_admit(&s->pacer, busy)) {
            double t0 = cp_now_ms();
            const int taken = admit(s, busy);
            const double dt = cp_now_ms() - t0;
            s->admit_s += dt / 1e3;
            srv_pacer_admitted(&s->pacer, busy, dt);
            if (busy) srv_metrics_admitted_between_steps(s->metrics, taken);
        }
        cancel_gone(s); /* also when its job has finished already: the queue's reference goes */
        if (cp_batcher_pending(s->batcher)) {
            double t0 = cp_now_ms();
            step(s);
            srv_pacer_stepped(&s->pacer, cp_now_ms() - t0);
            continue;
        }
        const double t0 = cp_now_ms();
        /* with jobs being prepared, a queued job may be unable to start
         * until one of them is back (its tenant's last place, a purge of
         * its tenant, every place taken): wait for a change, not for a
         * queued job (stopping, the ones being prepared still run) */
        int more = s->n_preparing ? srv_queue_wait_since(s->queue, seen) : srv_queue_wait(s->queue);
        s->idle_s += (cp_now_ms() - t0) / 1e3;
        publish_batch(s);
        if (!more && !s->n_preparing) return NULL; /* stopping and drained */
    }
}

static void free_sched(srv_sched *s)
{
    if (s->prep_started) {
        pthread_mutex_lock(&s->prep_mu);
        s->prep_stop = 1;
        pthread_cond_signal(&s->prep_cv);
        pthread_mutex_unlock(&s->prep_mu);
        pthread_join(s->prep, NULL);
    }
    pthread_mutex_destroy(&s->prep_mu);
    pthread_cond_destroy(&s->prep_cv);
    cp_batcher_free(s->batcher);
    srv_queue_free(s->queue);
    free(s->fl), free(s);
}

cp_status srv_sched_start(const srv_engine *eng, size_t max_queue, size_t per_tenant, uint32_t n_tenants, srv_metrics *metrics,
                          srv_sched **out, cp_error *err)
{
    *out = NULL;
    srv_sched *s = cp_calloc(1, sizeof *s, "scheduler", err);
    if (!s) return CP_ENOMEM;
    s->eng = *eng, s->metrics = metrics;
    if (pthread_mutex_init(&s->prep_mu, NULL)) {
        free(s);
        return cp_fail(err, CP_ENOMEM, "server: cannot make the preparing thread's locks");
    }
    if (pthread_cond_init(&s->prep_cv, NULL)) {
        pthread_mutex_destroy(&s->prep_mu);
        free(s);
        return cp_fail(err, CP_ENOMEM, "server: cannot make the preparing thread's locks");
    }
    if (s->eng.concurrency <= 0) s->eng.concurrency = SRV_CONCURRENCY_DEFAULT;
    if (s->eng.step_tokens <= 0) s->eng.step_tokens = CP_BATCH_STEP_TOKENS_CPU;
    if (!s->eng.kv_bytes) s->eng.kv_bytes = SRV_KV_BYTES_DEFAULT;
    /* the batcher's own checks (--step-tokens past --concurrency, the KV
     * budget) refuse a bad setting; the per-tenant cap is the queue's */
    cp_batcher_opts bo = { .max_running = s->eng.concurrency, .step_tokens = s->eng.step_tokens,
                           .prefill_tokens = s->eng.prefill_tokens, .kv_bytes = s->eng.kv_bytes, .prefill_by_tenant = 1 };
    cp_status rc = srv_queue_create(max_queue, per_tenant, n_tenants, metrics, &s->queue, err);
    if (rc == CP_OK && !(s->fl = cp_calloc((size_t)s->eng.concurrency, sizeof *s->fl, "jobs in flight", err))) rc = CP_ENOMEM;
    if (rc == CP_OK) rc = cp_batcher_create(eng->engine, &bo, &s->batcher, err);
    if (rc == CP_OK && !(s->prep_started = !pthread_create(&s->prep, NULL, prep_thread, s)))
        rc = cp_fail(err, CP_ENOMEM, "server: cannot start the preparing thread");
    if (rc) {
        free_sched(s);
        return rc;
    }
    if (pthread_create(&s->thread, NULL, engine_thread, s)) {
        free_sched(s);
        return cp_fail(err, CP_ENOMEM, "server: cannot start the engine thread");
    }
    *out = s;
    return CP_OK;
}

cp_status srv_sched_check(srv_sched *s, srv_gen *g, cp_error *err)
{
    cp_request req = request_of(g, 0);
    int prompt = 0;
    /* no max_tokens sent: as many as the context leaves after the prompt,
     * up to the default (OpenAI's and vLLM's reading), not a refusal for a
     * default the client never asked for */
    if (!g->max_tokens_given) req.max_tokens = 1;
    cp_status rc = cp_engine_check_request(s->eng.engine, &req, &prompt, err);
    if (rc == CP_OK && !g->max_tokens_given) {
        const int context = cp_engine_context(s->eng.engine) - prompt; /* >= 1: the check passed with one */
        const int budget = cp_batcher_room(s->batcher, prompt);         /* 0: the prompt alone is past it, refused below */
        if (g->max_tokens > context) g->max_tokens = context;
        if (budget > 0 && g->max_tokens > budget) g->max_tokens = budget;
    }
    if (rc == CP_OK && !cp_batcher_fits(s->batcher, prompt, g->max_tokens))
        rc = cp_fail(err, CP_ERANGE, "request: %d prompt tokens + %d to generate exceed the KV budget (--kv-budget)", prompt,
                     g->max_tokens);
    return rc;
}

srv_submit srv_sched_submit(srv_sched *s, srv_job *j) { return srv_queue_push(s->queue, j); }

void srv_sched_cancel(srv_sched *s, srv_job *j) { srv_queue_cancel(s->queue, j); }

void srv_sched_close(srv_sched *s) { srv_queue_close(s->queue); }

size_t srv_sched_pending(srv_sched *s) { return srv_queue_pending(s->queue); }

void srv_sched_stop(srv_sched *s)
{
    if (!s) return;
    srv_queue_stop(s->queue);
    pthread_join(s->thread, NULL);
    free_sched(s);
}
