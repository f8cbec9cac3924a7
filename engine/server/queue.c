/* The server's one queue (see queue.h). */
#include "queue.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/clock.h"
#include "../../kernels/log.h"

struct srv_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job **ring;
    size_t cap, head, n; /* n queued, from ring[head] */
    size_t taken;        /* jobs taken by the engine and not yet answered */
    int closed, stopping;
    uint64_t events;     /* pushes, withdrawals, cancellations, kicks and the stop: srv_queue_wait_since */
    size_t per_tenant;   /* 0 = no cap */
    uint32_t n_tenants;
    uint32_t *pending;   /* [n_tenants]: queued + taken generations */
    uint32_t *queued;    /* [n_tenants]: queued generations (pending - queued: taken, in the engine) */
    uint32_t *seen, scan; /* [n_tenants]: seen[t] == scan once first_startable met tenant t's first job */
    srv_job **gone;      /* taken jobs whose client left, for the engine thread (a reference each) */
    size_t n_gone, cap_gone;
    srv_metrics *metrics;
};

cp_status srv_queue_create(size_t cap, size_t per_tenant, uint32_t n_tenants, srv_metrics *metrics, srv_queue **out, cp_error *err)
{
    *out = NULL;
    if (cap < 1) return cp_fail(err, CP_ERANGE, "server: the queue must hold at least one request");
    srv_queue *q = cp_calloc(1, sizeof *q, "request queue", err);
    if (!q) return CP_ENOMEM;
    q->cap = cap, q->per_tenant = per_tenant, q->n_tenants = n_tenants, q->metrics = metrics;
    if (!(q->ring = cp_calloc(cap, sizeof *q->ring, "request queue", err)) ||
        !(q->pending = cp_calloc(n_tenants ? n_tenants : 1, sizeof *q->pending, "per-tenant counts", err)) ||
        !(q->seen = cp_calloc(n_tenants ? n_tenants : 1, sizeof *q->seen, "per-tenant marks", err)) ||
        !(q->queued = cp_calloc(n_tenants ? n_tenants : 1, sizeof *q->queued, "per-tenant counts", err))) {
        free(q->ring), free(q);
        return CP_ENOMEM;
    }
    if (pthread_mutex_init(&q->mu, NULL)) {
        free(q->queued), free(q->seen), free(q->pending), free(q->ring), free(q);
        return cp_fail(err, CP_ENOMEM, "server: cannot create the queue lock");
    }
    if (pthread_cond_init(&q->cv, NULL)) {
        pthread_mutex_destroy(&q->mu);
        free(q->queued), free(q->seen), free(q->pending), free(q->ring), free(q);
        return cp_fail(err, CP_ENOMEM, "server: cannot create the queue's condition");
    }
    *out = q;
    return CP_OK;
}

void srv_queue_free(srv_queue *q)
{
    if (!q) return;
    for (size_t k = 0; k < q->n; k++) srv_job_unref(q->ring[(q->head + k) % q->cap]);
    for (size_t k = 0; k < q->n_gone; k++) srv_job_unref(q->gone[k]);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q->gone), free(q->queued), free(q->seen), free(q->pending), free(q->ring), free(q);
}

static void queue_length(srv_queue *q)
{
    if (q->metrics) srv_metrics_queue(q->metrics, q->n);
}

/* The queued (not yet started) purge of tenant that a new purge of it may
 * join, or NULL: one with no request of the tenant queued after it.  A
 * purge that has not run erases everything stored before the new one
 * arrived too -- but a request queued behind it runs, and stores, after it
 * has answered: a purge asked for after that request must run after it. */
static srv_job *joinable_purge_of(const srv_queue *q, uint32_t tenant)
{
    for (size_t k = q->n; k-- > 0;) {
        srv_job *o = q->ring[(q->head + k) % q->cap];
        if (o->purge && o->purge_tenant == tenant) return o;
        if (!o->purge && o->tenant == tenant) return NULL;
    }
    return NULL;
}

srv_submit srv_queue_push(srv_queue *q, srv_job *j)
{
    pthread_mutex_lock(&q->mu);
    /* purges are not held to a tenant's cap (an erasure asked for is not
     * refused for the tenant's own load), so a second purge of a tenant
     * joins the queued one when none of the tenant's requests is queued
     * after it: a tenant at its cap cannot fill the queue with them and
     * shut the others out (between two purges that cannot join stands one
     * of its requests, and those are capped) */
    srv_job *same = !q->closed && j->purge ? joinable_purge_of(q, j->purge_tenant) : NULL;
    if (same) {
        srv_job_ref(same);
        j->joined = same;
        pthread_mutex_unlock(&q->mu);
        return SRV_SUBMIT_OK;
    }
    srv_submit r = q->closed ? SRV_SUBMIT_CLOSED : q->n == q->cap ? SRV_SUBMIT_FULL : SRV_SUBMIT_OK;
    int counted = r == SRV_SUBMIT_OK && !j->purge;
    if (counted && (j->tenant >= q->n_tenants || (q->per_tenant && q->pending[j->tenant] >= q->per_tenant)))
        r = SRV_SUBMIT_TENANT_FULL;
    /* the last eighth of the places only for a tenant with nothing queued,
     * purges included (one that cannot join takes a place): a few tenants
     * together cannot fill the queue, with requests or with purges between
     * them, and turn a newcomer's first request away */
    else if (r == SRV_SUBMIT_OK && j->tenant < q->n_tenants && q->queued[j->tenant] > 0 && q->n + q->cap / 8 >= q->cap)
        r = SRV_SUBMIT_FULL;
    if (r == SRV_SUBMIT_OK) {
        if (counted) q->pending[j->tenant]++, q->queued[j->tenant]++;
        srv_job_ref(j);
        j->t_submit_ms = cp_now_ms();
        q->ring[(q->head + q->n) % q->cap] = j;
        q->n++;
        queue_length(q);
        q->events++, pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return r;
}

/* The job answered as cancelled (it never ran). */
static void answer_cancelled(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->cancelled = 1;
    if (j->rc == CP_OK) j->rc = CP_EIO, snprintf(j->err, sizeof j->err, "cancelled: the client went away");
    j->state = SRV_JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* The job at place k out of the ring: the ones before it move back one
 * place, so every other job keeps its order (the head: nothing moves). */
static srv_job *ring_remove(srv_queue *q, size_t k)
{
    srv_job *j = q->ring[(q->head + k) % q->cap];
    for (; k > 0; k--) q->ring[(q->head + k) % q->cap] = q->ring[(q->head + k - 1) % q->cap];
    q->head = (q->head + 1) % q->cap;
    q->n--;
    if (!j->purge && j->tenant < q->n_tenants) q->queued[j->tenant]--;
    return j;
}

/* j out of the ring, under the lock, if it is there: the others keep their
 * order (still first come, first served) and its tenant's slot is free.  1
 * when it was there. */
static int withdraw(srv_queue *q, srv_job *j)
{
    size_t k = 0;
    while (k < q->n && q->ring[(q->head + k) % q->cap] != j) k++;
    if (k == q->n) return 0;
    ring_remove(q, k);
    if (j->tenant < q->n_tenants && !j->purge) q->pending[j->tenant]--;
    queue_length(q);
    q->events++, pthread_cond_broadcast(&q->cv);
    return 1;
}

/* A queued job leaves without running: withdrawn, answered as cancelled,
 * counted, the queue's reference dropped. */
static void cancel_queued(srv_queue *q, srv_job *j)
{
    answer_cancelled(j);
    if (q->metrics) srv_metrics_cancelled(q->metrics, 1); /* it never ran */
    srv_job_unref(j);
}

void srv_queue_cancel(srv_queue *q, srv_job *j)
{
    if (j->purge) return; /* an erasure asked for is done */
    pthread_mutex_lock(&q->mu);
    /* flagged and looked for under the queue's lock, where the engine takes
     * and starts jobs: the job is either still queued or already running */
    srv_job_state st = srv_job_cancel(j);
    if (withdraw(q, j)) {
        cancel_queued(q, j);
    } else if (st == SRV_JOB_RUNNING || st == SRV_JOB_STREAMING) {
        int known = 0;
        for (size_t k = 0; k < q->n_gone; k++) known |= q->gone[k] == j;
        if (!known && q->n_gone == q->cap_gone) {
            size_t c = q->cap_gone ? q->cap_gone * 2 : 16;
            srv_job **v = realloc(q->gone, c * sizeof *v);
            if (v) q->gone = v, q->cap_gone = c;
        }
        if (!known && q->n_gone < q->cap_gone) {
            srv_job_ref(j);
            q->gone[q->n_gone++] = j;
            q->events++, pthread_cond_broadcast(&q->cv); /* an idle engine thread drops its reference now (srv_queue_wait) */
        } else if (!known) { /* out of memory: it still stops at its next token (on_piece sees the flag) */
            cp_warn("serve: out of memory noting a cancelled request; it stops at its next token");
        }
    }
    pthread_mutex_unlock(&q->mu);
}

void srv_queue_close(srv_queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_mutex_unlock(&q->mu);
}

size_t srv_queue_pending(srv_queue *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->n + q->taken;
    pthread_mutex_unlock(&q->mu);
    return n;
}

/* The place of the job to start now, or q->n.  Each tenant's jobs leave
 * in arrival order: only a tenant's oldest queued job is looked at, and a
 * purge holds its tenant's later jobs until it has run (what they ask must
 * not be served from what the purge erases).  Among the tenants whose
 * oldest job may start, the one with the fewest generations in the engine
 * goes first (ties: the older job), so places in flight are shared evenly
 * between tenants with work waiting, however many each has queued (ranked
 * by queued + running, a tenant that kept one request fewer queued took
 * three quarters of the places from one with as much to do); what the
 * jobs would hit in the cache plays no part.  A generation that may not
 * start for want of room holds every generation (none can start). */
static size_t first_startable(srv_queue *q, int (*may)(void *ctx, const srv_job *head), void *ctx)
{
    if (++q->scan == 0) { /* the marks wrapped: none is current */
        memset(q->seen, 0, (q->n_tenants ? q->n_tenants : 1) * sizeof *q->seen);
        q->scan = 1;
    }
    size_t best = q->n;
    uint64_t best_load = UINT64_MAX;
    for (size_t k = 0; k < q->n; k++) {
        const srv_job *j = q->ring[(q->head + k) % q->cap];
        const uint32_t t = j->purge ? j->purge_tenant : j->tenant;
        const int known = t < q->n_tenants;
        if (known && q->seen[t] == q->scan) continue; /* behind its tenant's oldest */
        if (known) q->seen[t] = q->scan;
        const int m = may(ctx, j);
        if (m == SRV_MAY_START) {
            const uint64_t load = known ? q->pending[t] - q->queued[t] : UINT32_MAX; /* its places in the engine */
            if (load < best_load) best = k, best_load = load;
        } else if (m == SRV_MAY_WAIT && !j->purge) {
            break; /* no room in flight: no generation starts (a purge's wait is its tenant's) */
        }
    }
    return best;
}

srv_job *srv_queue_take(srv_queue *q, size_t *round, int (*may)(void *ctx, const srv_job *head), void *ctx)
{
    srv_job *j = NULL;
    pthread_mutex_lock(&q->mu);
    if (*round == SIZE_MAX) *round = q->n;
    size_t k;
    while (!j && q->n && *round && (k = first_startable(q, may, ctx)) < q->n) {
        srv_job *h = ring_remove(q, k);
        (*round)--;
        queue_length(q);
        /* started under the lock a cancel takes: one flagged by a caller of
         * srv_job_cancel alone is dropped here, never run; so is one whose
         * client left before its turn (a request sent and abandoned at once
         * costs the engine nothing: its connection's thread would see the
         * close only at its next look).  Still in the ring, the job's
         * connection thread has not withdrawn it, so its socket is open. */
        if (!h->purge && srv_peer_gone(h->fd)) srv_job_cancel(h);
        if (!h->purge && !srv_job_start(h)) {
            if (h->tenant < q->n_tenants) q->pending[h->tenant]--;
            cancel_queued(q, h);
            continue;
        }
        q->taken++;
        j = h;
    }
    pthread_mutex_unlock(&q->mu);
    return j;
}

srv_job *srv_queue_next_cancelled(srv_queue *q)
{
    pthread_mutex_lock(&q->mu);
    srv_job *j = q->n_gone ? q->gone[--q->n_gone] : NULL;
    pthread_mutex_unlock(&q->mu);
    return j;
}

void srv_queue_release(srv_queue *q, const srv_job *j)
{
    pthread_mutex_lock(&q->mu);
    if (!j->purge && j->tenant < q->n_tenants) q->pending[j->tenant]--;
    pthread_mutex_unlock(&q->mu);
}

void srv_queue_done(srv_queue *q, srv_job *j)
{
    pthread_mutex_lock(&q->mu);
    q->taken--;
    q->events++, pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    srv_job_unref(j);
}

int srv_queue_wait(srv_queue *q)
{
    pthread_mutex_lock(&q->mu);
    /* a cancelled job's reference is dropped by the engine thread even when
     * nothing else is to do: held, it would keep the job's prompt alive */
    while (q->n == 0 && q->n_gone == 0 && !q->stopping) pthread_cond_wait(&q->cv, &q->mu);
    int more = q->n != 0 || !q->stopping; /* stopping and drained: 0 (woken for a cancelled job: 1) */
    pthread_mutex_unlock(&q->mu);
    return more;
}

uint64_t srv_queue_events(srv_queue *q)
{
    pthread_mutex_lock(&q->mu);
    const uint64_t e = q->events;
    pthread_mutex_unlock(&q->mu);
    return e;
}

int srv_queue_wait_since(srv_queue *q, uint64_t seen)
{
    pthread_mutex_lock(&q->mu);
    while (q->events == seen) pthread_cond_wait(&q->cv, &q->mu);
    int more = q->n != 0 || !q->stopping;
    pthread_mutex_unlock(&q->mu);
    return more;
}

void srv_queue_kick(srv_queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->events++, pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void srv_queue_stop(srv_queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = 1, q->stopping = 1;
    q->events++, pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
