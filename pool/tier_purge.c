/* Purges: a tenant's epoch moved and its private keys deleted in Redis
 * (through the writer), and the epoch read at each request, by which every
 * replica drops what it holds of a purged tenant. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tier_internal.h"

#include "../kernels/clock.h"
#include "../kernels/log.h"

/* ---- in Redis, run by the writer thread ------------------------------------------------ */

/* a key name of a segment value (":v:" in it), not an index */
static int names_value(const char *s, size_t n)
{
    for (size_t i = 0; i + 3 <= n; i++)
        if (s[i] == ':' && s[i + 1] == 'v' && s[i + 2] == ':') return 1;
    return 0;
}

/* SCAN ... MATCH pattern, UNLINK what it finds: the number of segment
 * values (":v:" keys) among what it found; -1 on a failure */
long tier_scan_delete(cp_tier *t, tier_conn *k, const char *pattern)
{
    char cursor[32] = "0";
    long values = 0;
    do {
        const char *a[6] = { "SCAN", cursor, "MATCH", pattern, "COUNT", "1000" };
        size_t l[6] = { 4, strlen(cursor), 5, strlen(pattern), 5, 4 };
        redisReply *r = tier_command(t, k, 6, a, l);
        if (!r) return -1;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[0]->len >= sizeof cursor || r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            return -1;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len);
        cursor[r->element[0]->len] = 0;
        redisReply *keys = r->element[1];
        if (keys->elements) {
            const char **a2 = malloc((keys->elements + 1) * sizeof *a2);
            size_t *l2 = malloc((keys->elements + 1) * sizeof *l2);
            redisReply *d = NULL;
            if (a2 && l2) {
                a2[0] = "UNLINK", l2[0] = 6;
                for (size_t i = 0; i < keys->elements; i++) {
                    const redisReply *e = keys->element[i];
                    if (e->type != REDIS_REPLY_STRING) break; /* hostile or broken: the whole batch is refused below */
                    a2[i + 1] = e->str, l2[i + 1] = e->len;
                    values += names_value(e->str, e->len);
                    if (i + 1 == keys->elements) d = tier_command(t, k, (int)keys->elements + 1, a2, l2);
                }
            }
            free(a2), free(l2);
            if (!d || d->type != REDIS_REPLY_INTEGER) {
                if (d) freeReplyObject(d);
                freeReplyObject(r);
                return -1;
            }
            freeReplyObject(d);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    return values;
}

/* the purge's first step: the tenant's epoch moves (INCR, no TTL), so every
 * replica drops what it holds of the tenant at its next request, and no
 * private value written before is used again; 0 on a failure */
int tier_epoch_bump(cp_tier *t, tier_conn *k, const char *ekey)
{
    const char *a[2] = { "INCR", ekey };
    size_t l[2] = { 4, strlen(ekey) };
    redisReply *r = tier_command(t, k, 2, a, l);
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    if (r) freeReplyObject(r);
    return ok;
}

/* ---- purge ----------------------------------------------------------------------------- */

long cp_tier_purge(cp_tier *t, uint32_t tenant, double max_s)
{
    uint8_t tk[CP_TIER_KEY_BYTES];
    if (!tier_tenant_key_get(t, tenant, tk)) return 0; /* never bound: nothing of it was ever written */
    tier_job *j = calloc(1, sizeof *j);
    if (!j) return -1;
    char h[2 * CP_TIER_KEY_BYTES + 1];
    tier_hex(tk, CP_TIER_KEY_BYTES, h);
    j->kind = JOB_PURGE;
    snprintf(j->vkey, sizeof j->vkey, "%s:p:%s:*", t->prefix, h);
    tier_epoch_key(t, tk, j->ikey, sizeof j->ikey);
    /* this replica re-reads the epoch at the tenant's next request too */
    pthread_mutex_lock(&t->ten_lock);
    t->ten[tenant].epoch_known = 0;
    pthread_mutex_unlock(&t->ten_lock);
    /* behind every write queued before it, never refused for room */
    if (!tier_enqueue(t, j, 0)) return -1;
    double end = cp_now_s() + max_s;
    pthread_mutex_lock(&t->q_lock);
    while (!j->done && cp_now_s() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&t->q_progress, &t->q_lock, &ts);
    }
    long res = -1;
    if (j->done) {
        res = j->result;
        tier_job_free(j);
    } else {
        j->abandoned = 1; /* the writer frees it when it gets there */
    }
    pthread_mutex_unlock(&t->q_lock);
    if (res < 0) cp_warn("tier: a purge did not reach redis; the tenant's keys there stay until their TTL");
    return res;
}

/* ---- the purge epoch ------------------------------------------------------------------- */

/* a GET reply of an epoch: absent is 0 (never purged, or Redis lost it:
 * any change drops the local copies, so a reset errs on the safe side);
 * anything but a short decimal is unreadable */
static int epoch_parse(const redisReply *r, uint32_t *out)
{
    if (r->type == REDIS_REPLY_NIL) return *out = 0, 1;
    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 20) return 0;
    unsigned long long v = 0;
    for (size_t i = 0; i < r->len; i++) {
        if (r->str[i] < '0' || r->str[i] > '9') return 0;
        v = v * 10 + (unsigned)(r->str[i] - '0');
    }
    *out = (uint32_t)v; /* the value header keeps 32 bits: epochs 2^32 purges apart are not told apart */
    return 1;
}

int cp_tier_epoch_sync(cp_tier *t, uint32_t tenant)
{
    uint8_t tk[CP_TIER_KEY_BYTES];
    if (!tier_tenant_key_get(t, tenant, tk)) return 0;
    char ekey[TIER_KEY_MAX];
    tier_epoch_key(t, tk, ekey, sizeof ekey);
    const char *a[2] = { "GET", ekey };
    size_t l[2] = { 3, strlen(ekey) };
    pthread_mutex_lock(&t->rd_lock);
    redisReply *r = tier_command(t, &t->rd, 2, a, l);
    pthread_mutex_unlock(&t->rd_lock);
    uint32_t now = 0;
    int read = r && epoch_parse(r, &now);
    if (r) freeReplyObject(r);
    pthread_mutex_lock(&t->ten_lock);
    tier_tenant *e = &t->ten[tenant];
    int drop = !read || !e->epoch_known || e->epoch != now, moved = read && e->epoch_known && e->epoch != now;
    e->epoch_known = read, e->epoch = now;
    pthread_mutex_unlock(&t->ten_lock);
    if (moved) STAT_ADD(t, epoch_purges, 1); /* a purge through another replica (a first read is none) */
    return drop;
}
