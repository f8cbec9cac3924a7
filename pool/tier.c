/* The shared segment tier on Redis (see tier.h): its options, creation
 * (checks, the writer thread), draining, freeing, statistics.  The rest is
 * one file per job: tier_conn.c (connections, breakers), tier_keys.c (key
 * space, tenants), tier_writer.c (queue, writer thread), tier_put.c
 * (write-through), tier_fill.c (lookups into the local pool),
 * tier_purge.c (purges, epochs), tier_quota.c, tier_value.c, tier_url.c. */
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tier_internal.h"

#include "../kernels/clock.h"
#include "../kernels/log.h"

void cp_tier_opts_default(cp_tier_opts *o)
{
    memset(o, 0, sizeof *o);
    o->prefix = "cacheprune";
    o->timeout_s = 0.25;
    o->cooldown_s = 1.0;
    o->ttl_s = 86400;
    o->queue_cap = 256;
    o->queue_bytes = (size_t)256 << 20;
    o->drain_s = 5;
    o->quota_window_s = 60;
}

void tier_hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = d[b[i] >> 4], out[2 * i + 1] = d[b[i] & 15];
    out[2 * n] = 0;
}

/* ---- life ------------------------------------------------------------------------------ */

static int prefix_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > TIER_PREFIX_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        /* no ':' (it separates the key's parts) and nothing SCAN's MATCH would read as a pattern */
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

cp_status cp_tier_create(const cp_tier_opts *o, const cp_kv_layout *l, cp_backend *be, cp_tier **out, cp_error *err)
{
    *out = NULL;
    const char *prefix = o->prefix ? o->prefix : "cacheprune";
    if (!prefix_ok(prefix))
        return cp_fail(err, CP_EINVAL, "--tier-prefix: 1..%d letters, digits, '_', '-' or '.'", TIER_PREFIX_MAX);
    if (!o->url.host[0] || o->url.port <= 0) return cp_fail(err, CP_EINVAL, "tier: no endpoint");
    if (!o->key || o->key_len < CP_TIER_VALUE_KEY_MIN)
        return cp_fail(err, CP_EINVAL, "tier: no value key of at least %d bytes (--tier-key-file): values could be forged", CP_TIER_VALUE_KEY_MIN);
    if (o->vocab == 0 || o->max_pos == 0) return cp_fail(err, CP_EINVAL, "tier: the model's vocabulary and context are needed to check values");
    if (!(o->timeout_s > 0 && o->timeout_s <= 60) || !(o->cooldown_s >= 0 && o->cooldown_s <= 3600) || !(o->ttl_s >= 1) ||
        o->queue_cap == 0 || !(o->quota_window_s >= 0.001))
        return cp_fail(err, CP_EINVAL, "tier: timeout, cooldown, TTL or queue size out of range");
    cp_tier *t = calloc(1, sizeof *t);
    if (!t) return cp_fail(err, CP_ENOMEM, "tier: out of memory");
    t->o = *o;
    snprintf(t->prefix, sizeof t->prefix, "%s", prefix);
    t->o.prefix = t->prefix;
    t->l = *l;
    t->be = be;
    tier_hex(l->fingerprint, 8, t->fp);
    t->rd.name = "lookup", t->wr.name = "writer";
    if (o->password) {
        if (!(t->password = malloc(o->password_len + 1))) {
            free(t);
            return cp_fail(err, CP_ENOMEM, "tier: out of memory");
        }
        memcpy(t->password, o->password, o->password_len);
        t->password[o->password_len] = 0;
    }
    if (!(t->key = malloc(o->key_len))) {
        free(t->password);
        free(t);
        return cp_fail(err, CP_ENOMEM, "tier: out of memory");
    }
    memcpy(t->key, o->key, o->key_len);
    t->o.password = NULL, t->o.key = NULL; /* the caller's copies are not ours to keep pointing at */
    pthread_mutex_init(&t->rd_lock, NULL);
    pthread_mutex_init(&t->ten_lock, NULL);
    pthread_mutex_init(&t->q_lock, NULL);
    pthread_mutex_init(&t->st_lock, NULL);
    pthread_cond_init(&t->q_work, NULL);
    pthread_cond_init(&t->q_progress, NULL);
    if (pthread_create(&t->writer, NULL, tier_writer_main, t) != 0) {
        cp_tier_free(t);
        return cp_fail(err, CP_ENOMEM, "tier: cannot start the writer thread");
    }
    t->writer_started = 1;
    *out = t;
    return CP_OK;
}

int cp_tier_drain(cp_tier *t, double max_s)
{
    double end = cp_now_s() + max_s;
    pthread_mutex_lock(&t->q_lock);
    while ((t->head || t->busy) && cp_now_s() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&t->q_progress, &t->q_lock, &ts);
    }
    int empty = !t->head && !t->busy;
    pthread_mutex_unlock(&t->q_lock);
    return empty;
}

void cp_tier_free(cp_tier *t)
{
    if (!t) return;
    if (t->writer_started) {
        if (!cp_tier_drain(t, t->o.drain_s)) cp_warn("tier: %zu pending writes not drained in %.1f s: dropped", t->q_n, t->o.drain_s);
        pthread_mutex_lock(&t->q_lock);
        t->stop = 1;
        /* what is left is dropped: the writer finishes the job in hand only */
        size_t dropped = 0;
        for (tier_job *j = t->head, *nx; j; j = nx) {
            nx = j->next;
            if (j->kind == JOB_PURGE) {
                j->result = -1, j->done = 1;
                if (j->abandoned) tier_job_free(j);
            } else {
                tier_job_free(j), dropped++;
            }
        }
        t->head = t->tail = NULL;
        t->q_n = t->q_bytes = 0;
        pthread_cond_broadcast(&t->q_work);
        pthread_mutex_unlock(&t->q_lock);
        STAT_ADD(t, write_drops, dropped);
        pthread_join(t->writer, NULL);
    }
    if (t->rd.c) redisFree(t->rd.c);
    if (t->wr.c) redisFree(t->wr.c);
    if (t->password) {
        OPENSSL_cleanse(t->password, t->o.password_len);
        free(t->password);
    }
    if (t->key) {
        volatile uint8_t *v = t->key;
        for (size_t i = 0; i < t->o.key_len; i++) v[i] = 0;
        free(t->key);
    }
    free(t->ten);
    pthread_mutex_destroy(&t->rd_lock);
    pthread_mutex_destroy(&t->ten_lock);
    pthread_mutex_destroy(&t->q_lock);
    pthread_mutex_destroy(&t->st_lock);
    pthread_cond_destroy(&t->q_work);
    pthread_cond_destroy(&t->q_progress);
    free(t);
}

void cp_tier_stats_get(cp_tier *t, cp_tier_stats *out)
{
    pthread_mutex_lock(&t->st_lock);
    *out = t->st;
    pthread_mutex_unlock(&t->st_lock);
}
