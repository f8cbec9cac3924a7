/* Insert quotas across replicas: per-tenant counters in Redis over
 * wall-clock windows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tier_internal.h"

/* the counter keys of the tenant's current window (and of the one before) */
static int quota_keys(cp_tier *t, uint32_t tenant, char *bytes, char *segs, char *prev_b, char *prev_s, size_t cap)
{
    uint8_t tk[CP_TIER_KEY_BYTES];
    if (!t->o.quota_bytes && !t->o.quota_segments) return 0;
    if (!tier_tenant_key_get(t, tenant, tk)) return 0;
    char h[2 * CP_TIER_KEY_BYTES + 1];
    tier_hex(tk, CP_TIER_KEY_BYTES, h);
    /* wall-clock windows: every replica must agree on where one starts */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long w = (long long)(((double)ts.tv_sec + ts.tv_nsec * 1e-9) / t->o.quota_window_s);
    snprintf(bytes, cap, "%s:q:%s:%lld:bytes", t->prefix, h, w);
    snprintf(segs, cap, "%s:q:%s:%lld:segs", t->prefix, h, w);
    snprintf(prev_b, cap, "%s:q:%s:%lld:bytes", t->prefix, h, w - 1);
    snprintf(prev_s, cap, "%s:q:%s:%lld:segs", t->prefix, h, w - 1);
    return 1;
}

int cp_tier_quota_allow(cp_tier *t, uint32_t tenant, size_t bytes)
{
    char kb[TIER_KEY_MAX], ks[TIER_KEY_MAX], pb[TIER_KEY_MAX], ps[TIER_KEY_MAX];
    if (!quota_keys(t, tenant, kb, ks, pb, ps, sizeof kb)) return 1;
    const char *a[3] = { "MGET", kb, ks };
    size_t l[3] = { 4, strlen(kb), strlen(ks) };
    pthread_mutex_lock(&t->rd_lock);
    redisReply *r = tier_command(t, &t->rd, 3, a, l);
    pthread_mutex_unlock(&t->rd_lock);
    if (!r) return 1;
    unsigned long long used_b = 0, used_s = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
        if (r->element[0]->type == REDIS_REPLY_STRING) used_b = strtoull(r->element[0]->str, NULL, 10);
        if (r->element[1]->type == REDIS_REPLY_STRING) used_s = strtoull(r->element[1]->str, NULL, 10);
    }
    freeReplyObject(r);
    int ok = (!t->o.quota_bytes || used_b + bytes <= t->o.quota_bytes) && (!t->o.quota_segments || used_s + 1 <= t->o.quota_segments);
    if (!ok) STAT_ADD(t, quota_refusals, 1);
    return ok;
}

void cp_tier_quota_charge(cp_tier *t, uint32_t tenant, size_t bytes)
{
    char kb[TIER_KEY_MAX], ks[TIER_KEY_MAX], pb[TIER_KEY_MAX], ps[TIER_KEY_MAX], n[24];
    if (!quota_keys(t, tenant, kb, ks, pb, ps, sizeof kb)) return;
    snprintf(n, sizeof n, "%zu", bytes);
    const char *a0[3] = { "INCRBY", kb, n }, *a1[2] = { "INCR", ks }, *a2[3] = { "UNLINK", pb, ps };
    size_t l0[3] = { 6, strlen(kb), strlen(n) }, l1[2] = { 4, strlen(ks) }, l2[3] = { 6, strlen(pb), strlen(ps) };
    int argc[3] = { 3, 2, 3 };
    const char **argv[3] = { a0, a1, a2 };
    size_t *lens[3] = { l0, l1, l2 };
    redisReply *r[3] = { 0 };
    pthread_mutex_lock(&t->rd_lock);
    if (tier_pipeline(t, &t->rd, 3, argc, argv, lens, r))
        for (int i = 0; i < 3; i++) freeReplyObject(r[i]);
    pthread_mutex_unlock(&t->rd_lock);
}
