/* cp_tier_fill: a request's uncovered non-sensitive windows looked up in
 * the tier, the best candidates fetched, checked and placed in the local
 * pool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier_internal.h"

#include "../kernels/clock.h"
#include "../kernels/log.h"

#define TIER_MAX_PROBES 32768 /* positions one fill asks about */
#define TIER_MAX_FETCH 64     /* segments one fill fetches */
#define TIER_MAX_CANDS 16     /* index fields one position considers */

typedef struct tier_cand {
    uint32_t pos, len;
    int priv;
    char sha[65];
    size_t q; /* its index query */
} tier_cand;

static int sha_hex_ok(const char *s, size_t n)
{
    if (n != 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* fields of one HGETALL reply into cands (at most TIER_MAX_CANDS of them) */
static size_t parse_fields(const redisReply *r, uint32_t pos, int priv, size_t q, tier_cand *out)
{
    size_t k = 0;
    if (r->type != REDIS_REPLY_ARRAY) return 0;
    for (size_t i = 0; i + 1 < r->elements && k < TIER_MAX_CANDS; i += 2) {
        const redisReply *f = r->element[i], *v = r->element[i + 1];
        if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING || !sha_hex_ok(f->str, f->len) || v->len == 0 || v->len > 9)
            continue;
        char num[10];
        memcpy(num, v->str, v->len);
        num[v->len] = 0;
        char *end;
        unsigned long len = strtoul(num, &end, 10);
        if (*end || len < TIER_WINDOW) continue;
        out[k] = (tier_cand){ .pos = pos, .len = (uint32_t)len, .priv = priv, .q = q };
        memcpy(out[k].sha, f->str, 64);
        out[k].sha[64] = 0;
        k++;
    }
    return k;
}

/* drops a bad or dangling entry: its index field, and the value when given */
static void drop_entry(cp_tier *t, const char *ikey, const char *field, const char *vkey)
{
    const char *a0[3] = { "HDEL", ikey, field }, *a1[2] = { "UNLINK", vkey };
    size_t l0[3] = { 4, strlen(ikey), strlen(field) }, l1[2] = { 6, vkey ? strlen(vkey) : 0 };
    int argc[2] = { 3, 2 };
    const char **argv[2] = { a0, a1 };
    size_t *lens[2] = { l0, l1 };
    redisReply *r[2] = { 0 };
    if (tier_pipeline(t, &t->rd, vkey ? 2 : 1, argc, argv, lens, r))
        for (int i = 0; i < 2; i++)
            if (r[i]) freeReplyObject(r[i]);
}

/* a checked value into the pool: 1 when stored (or already there) */
static int place(cp_tier *t, cp_pool *pool, uint32_t tenant, const cp_tier_seg *s)
{
    size_t part = (size_t)s->len * cp_kv_row(&t->l) * cp_dtype_size(t->l.dtype), total = (size_t)t->l.n_layers * 2 * part;
    const void **kp = malloc((size_t)t->l.n_layers * sizeof *kp), **vp = malloc((size_t)t->l.n_layers * sizeof *vp);
    uint8_t *flags = calloc(s->len, 1), *sens = calloc(s->len, 1);
    void *dev = NULL;
    cp_error err = { 0 };
    int ok = kp && vp && flags && sens && t->be->alloc(t->be, total, &dev, &err) == CP_OK && t->be->upload(t->be, dev, s->kv, total, &err) == CP_OK;
    if (ok) {
        for (int l = 0; l < t->l.n_layers; l++) {
            kp[l] = (const uint8_t *)dev + (size_t)(2 * l) * part;
            vp[l] = (const uint8_t *)dev + (size_t)(2 * l + 1) * part;
        }
        for (uint32_t i = 0; i < s->len; i++) flags[i] = (s->recompute[i / 8] >> (i % 8)) & 1;
        cp_kv_source src = { kp, vp, cp_kv_row(&t->l) };
        /* sens all zero: no segment holding a sensitive token is ever written to the tier */
        cp_insert in = { .tenant = tenant, .scope = s->shared ? CP_SCOPE_SHARED : CP_SCOPE_PRIVATE, .fingerprint = t->l.fingerprint,
                         .tokens = s->tokens, .len = s->len, .start_pos = s->start_pos, .recompute = flags, .sensitive = sens,
                         .kv = &src };
        uint32_t id;
        int dd;
        ok = cp_pool_insert(pool, &in, &id, &dd, &err) == CP_OK;
    }
    if (dev) t->be->free(t->be, dev);
    free(kp), free(vp), free(flags), free(sens);
    return ok;
}

/* fetches one candidate and places it: the request tokens it covers from
 * its position (0: not used) */
static uint32_t fetch(cp_tier *t, cp_pool *pool, uint32_t tenant, const uint8_t *tk, uint32_t epoch, const tier_cand *c,
                      const char *ikey, const int32_t *tokens, size_t n)
{
    char vkey[TIER_KEY_MAX];
    tier_value_key(t, c->priv ? tk : NULL, c->sha, vkey, sizeof vkey);
    const char *a[2] = { "GET", vkey };
    size_t l[2] = { 3, strlen(vkey) };
    redisReply *r = tier_command(t, &t->rd, 2, a, l);
    if (!r) return 0;
    uint32_t used = 0;
    if (r->type == REDIS_REPLY_NIL) { /* evicted or expired while its index entry stayed */
        STAT_ADD(t, dangling, 1);
        drop_entry(t, ikey, c->sha, NULL);
    } else if (r->type == REDIS_REPLY_STRING) {
        cp_tier_seg s;
        cp_error err = { 0 };
        char sha[65];
        cp_tier_check k = tier_check_of(t, vkey);
        cp_status rc = cp_tier_value_decode(&t->l, &k, (const uint8_t *)r->str, r->len, &s, &err);
        int ok = rc == CP_OK, stale = 0;
        if (ok) {
            tier_hex(s.sha, 32, sha);
            if (strcmp(sha, c->sha) != 0) ok = 0, snprintf(err.msg, sizeof err.msg, "tier value: not the segment its key names");
            else if (s.shared != !c->priv || (c->priv && memcmp(s.owner, tk, CP_TIER_KEY_BYTES) != 0))
                ok = 0, snprintf(err.msg, sizeof err.msg, "tier value: scope or owner is not its key space's");
            else if (c->priv && s.epoch != epoch) /* written before the tenant's last purge (a request in flight then) */
                ok = 0, stale = 1;
        }
        STAT_ADD(t, bytes_read, r->len);
        if (!ok) {
            if (!stale) cp_warn("tier: a stored value was rejected (%s): dropped", err.msg);
            pthread_mutex_lock(&t->st_lock);
            t->st.stale += stale;
            t->st.bad_values += !stale;
            t->st.bad_auth += rc == CP_EPERM;
            t->st.bad_range += rc == CP_ERANGE;
            pthread_mutex_unlock(&t->st_lock);
            drop_entry(t, ikey, c->sha, vkey);
        } else {
            uint32_t m = 0;
            while (m < s.len && c->pos + m < n && s.tokens[m] == tokens[c->pos + m]) m++;
            if (m >= TIER_WINDOW && place(t, pool, tenant, &s)) used = m;
        }
    }
    freeReplyObject(r);
    return used;
}

static int cand_cmp(const void *a, const void *b)
{
    const tier_cand *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    if (x->priv != y->priv) return x->priv ? -1 : 1; /* the tenant's own first, as the engine's lookups */
    return x->len > y->len ? -1 : x->len < y->len;
}

size_t cp_tier_fill(cp_tier *t, cp_pool *pool, uint32_t tenant, const int32_t *tokens, size_t n, const uint8_t *skip,
                    int want_private, int want_shared)
{
    if (n < TIER_WINDOW || (!want_private && !want_shared)) return 0;
    uint8_t tk[CP_TIER_KEY_BYTES];
    uint32_t epoch = 0;
    /* private values only under the epoch this request read (cp_tier_epoch_sync) */
    int priv = want_private && tier_tenant_epoch_get(t, tenant, tk, &epoch);
    int spaces = priv + (want_shared ? 1 : 0);
    if (!spaces) return 0;
    /* free[p]: tokens from p on that nothing covers and none is sensitive */
    uint32_t *freerun = malloc((n + 1) * sizeof *freerun);
    if (!freerun) return 0;
    freerun[n] = 0;
    size_t npos = 0;
    for (size_t p = n; p-- > 0;) freerun[p] = skip[p] ? 0 : freerun[p + 1] + 1;
    for (size_t p = 0; p < n; p++) npos += freerun[p] >= TIER_WINDOW;
    if (npos > TIER_MAX_PROBES) npos = TIER_MAX_PROBES;
    if (npos == 0) {
        free(freerun);
        return 0;
    }
    size_t nq = npos * (size_t)spaces, inserted = 0, ncand = 0;
    char *keys = malloc(nq * TIER_KEY_MAX + 1);
    uint32_t *qpos = malloc((nq + 1) * sizeof *qpos);
    int *argc = malloc((nq + 1) * sizeof *argc);
    const char **argv = malloc((nq * 2 + 1) * sizeof *argv), ***av = malloc((nq + 1) * sizeof *av);
    size_t *lens = malloc((nq * 2 + 1) * sizeof *lens), **lv = malloc((nq + 1) * sizeof *lv);
    redisReply **rep = calloc(nq + 1, sizeof *rep);
    tier_cand *cand = malloc((nq * TIER_MAX_CANDS + 1) * sizeof *cand);
    if (!keys || !qpos || !argc || !argv || !av || !lens || !lv || !rep || !cand) goto out;
    size_t q = 0;
    for (size_t p = 0; p < n && q < nq; p++) {
        if (freerun[p] < TIER_WINDOW) continue;
        for (int sp = 0; sp < spaces; sp++, q++) {
            char *k = keys + q * TIER_KEY_MAX;
            tier_index_key(t, sp == 0 && priv ? tk : NULL, tokens + p, k, TIER_KEY_MAX);
            qpos[q] = (uint32_t)p;
            argc[q] = 2;
            argv[2 * q] = "HGETALL", lens[2 * q] = 7;
            argv[2 * q + 1] = k, lens[2 * q + 1] = strlen(k);
            av[q] = argv + 2 * q, lv[q] = lens + 2 * q;
        }
    }
    pthread_mutex_lock(&t->rd_lock);
    double t0 = cp_now_s();
    if (tier_pipeline(t, &t->rd, nq, argc, av, lv, rep)) {
        for (q = 0; q < nq; q++) {
            int is_priv = priv && (spaces == 1 || q % 2 == 0);
            ncand += parse_fields(rep[q], qpos[q], is_priv, q, cand + ncand);
        }
        qsort(cand, ncand, sizeof *cand, cand_cmp);
        size_t covered_to = 0, fetched = 0; /* request tokens before covered_to are placed already */
        for (size_t i = 0; i < ncand && fetched < TIER_MAX_FETCH && t->rd.c; i++) {
            if (cand[i].pos < covered_to) continue;
            fetched++;
            uint32_t m = fetch(t, pool, tenant, tk, epoch, &cand[i], keys + cand[i].q * TIER_KEY_MAX, tokens, n);
            if (m) covered_to = cand[i].pos + m, inserted++;
        }
    }
    double ms = (cp_now_s() - t0) * 1e3;
    pthread_mutex_unlock(&t->rd_lock);
    pthread_mutex_lock(&t->st_lock);
    t->st.lookups++;
    t->st.hits += inserted;
    t->st.misses += inserted == 0;
    t->st.lookup_ms_sum += ms, t->st.lookup_ms_n++;
    pthread_mutex_unlock(&t->st_lock);
out:
    for (size_t i = 0; rep && i < nq; i++)
        if (rep[i]) freeReplyObject(rep[i]);
    free(freerun), free(keys), free(qpos), free(argc), free(argv), free(av), free(lens), free(lv), free(rep), free(cand);
    return inserted;
}
