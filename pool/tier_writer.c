/* The tier's writer thread and its queue: write-throughs (value, then its
 * index entry) and purges, in the order they were queued. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier_internal.h"

void tier_job_free(tier_job *j)
{
    if (!j) return;
    free(j->val);
    free(j);
}

static void do_put(cp_tier *t, tier_job *j)
{
    char ttl[24];
    snprintf(ttl, sizeof ttl, "%lld", (long long)(t->o.ttl_s > 1 ? t->o.ttl_s : 1));
    /* the value before its index entry: an entry never points at a value not yet there */
    const char *a0[5] = { "SET", j->vkey, (const char *)j->val, "EX", ttl };
    size_t l0[5] = { 3, strlen(j->vkey), j->n, 2, strlen(ttl) };
    const char *a1[4] = { "HSET", j->ikey, j->field, j->len };
    size_t l1[4] = { 4, strlen(j->ikey), strlen(j->field), strlen(j->len) };
    const char *a2[3] = { "EXPIRE", j->ikey, ttl };
    size_t l2[3] = { 6, strlen(j->ikey), strlen(ttl) };
    int argc[3] = { 5, 4, 3 };
    const char **argv[3] = { a0, a1, a2 };
    size_t *lens[3] = { l0, l1, l2 };
    redisReply *r[3] = { 0 };
    int ok = tier_pipeline(t, &t->wr, 3, argc, argv, lens, r);
    for (int i = 0; i < 3; i++) {
        if (r[i] && r[i]->type == REDIS_REPLY_ERROR) ok = 0;
        if (r[i]) freeReplyObject(r[i]);
    }
    pthread_mutex_lock(&t->st_lock);
    if (ok) t->st.writes++, t->st.bytes_written += j->n;
    else t->st.write_drops++;
    pthread_mutex_unlock(&t->st_lock);
}

void *tier_writer_main(void *arg)
{
    cp_tier *t = arg;
    pthread_mutex_lock(&t->q_lock);
    for (;;) {
        while (!t->head && !t->stop) pthread_cond_wait(&t->q_work, &t->q_lock);
        if (!t->head) break; /* stopping, nothing left */
        tier_job *j = t->head;
        t->head = j->next;
        if (!t->head) t->tail = NULL;
        t->q_n--, t->q_bytes -= j->n;
        t->busy = 1;
        pthread_mutex_unlock(&t->q_lock);
        long res = 0;
        if (j->kind == JOB_PUT) {
            do_put(t, j);
        } else {
            /* a purge is retried once past an open breaker: erasure matters more than a write */
            if (!tier_conn_ensure(t, &t->wr)) t->wr.open_until = 0;
            res = tier_epoch_bump(t, &t->wr, j->ikey) ? tier_scan_delete(t, &t->wr, j->vkey) : -1;
            if (res > 0) STAT_ADD(t, purged_keys, (uint64_t)res);
        }
        pthread_mutex_lock(&t->q_lock);
        t->busy = 0;
        if (j->kind == JOB_PURGE) {
            j->result = res, j->done = 1;
            if (j->abandoned) tier_job_free(j);
        } else {
            tier_job_free(j);
        }
        pthread_cond_broadcast(&t->q_progress);
    }
    pthread_mutex_unlock(&t->q_lock);
    return NULL;
}

/* queues j (takes it); 0 when the queue is full or stopping (j freed) */
int tier_enqueue(cp_tier *t, tier_job *j, int bounded)
{
    pthread_mutex_lock(&t->q_lock);
    int ok = !t->stop && (!bounded || (t->q_n < t->o.queue_cap && t->q_bytes + j->n <= t->o.queue_bytes));
    if (ok) {
        j->next = NULL;
        if (t->tail) t->tail->next = j;
        else t->head = j;
        t->tail = j;
        t->q_n++, t->q_bytes += j->n;
        pthread_cond_signal(&t->q_work);
    }
    pthread_mutex_unlock(&t->q_lock);
    if (!ok) tier_job_free(j);
    return ok;
}
