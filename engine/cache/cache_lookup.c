/* Lookup under the sharing policy: the local pool, then the tier (see
 * cache.h). */
#include "cache_internal.h"

#include <stdlib.h>
#include <string.h>

static void mark(cp_cache_mark_fn fn, void *ctx, int what)
{
    if (fn) fn(ctx, what);
}

/* The local pool's lookups, in the policy's order: the tenant's own private
 * segments, then shared ones. */
static cp_status lookup_local(cp_cache *c, const cp_cache_req *r, cp_cache_hits *h, cp_error *err)
{
    const cp_cache_policy *pol = &c->pol;
    if (!c->pool) return CP_OK;
    const cp_kv_layout *l = cp_pool_layout(c->pool);
    cp_lookup q = { .tenant = r->tenant, .fingerprint = l->fingerprint, .tokens = r->ids, .n = (size_t)r->T };
    cp_status rc = CP_OK;
    if (pol->lookup_private) {
        q.private_only = 1, q.prefix_only = pol->private_prefix;
        rc = cp_pool_lookup(c->pool, &q, &h->priv, err);
        if (pol->private_prefix) /* whole blocks */
            for (size_t i = 0; rc == CP_OK && i < h->priv.n; i++) h->priv.v[i].len -= h->priv.v[i].len % 16;
    }
    if (rc || !pol->lookup_shared) return rc;
    q.private_only = 0, q.prefix_only = pol->shared_prefix, q.whole_only = pol->shared_whole;
    uint8_t *m2 = NULL;
    if (pol->shared_masked) {
        /* shared segments only over non-sensitive tokens the tenant's own
         * segments did not already cover */
        if (!(m2 = malloc((size_t)r->T))) return cp_fail(err, CP_ENOMEM, "cache: out of memory masking a lookup");
        memcpy(m2, r->sensitive, (size_t)r->T);
        for (size_t i = 0; i < h->priv.n; i++) memset(m2 + h->priv.v[i].pos, 1, h->priv.v[i].len);
        q.sensitive = m2;
    } /* else no sensitivity: the leaky baseline */
    rc = cp_pool_lookup(c->pool, &q, &h->shared, err);
    free(m2);
    return rc;
}

/* The local pool first; where it left tokens uncovered, the tier fills the
 * pool (never asked about a window holding a sensitive token) and the
 * local lookups run again to place what it brought. */
cp_status cp_cache_lookup(cp_cache *c, const cp_cache_req *r, cp_cache_hits *h, cp_cache_mark_fn mark_fn, void *mark_ctx, cp_error *err)
{
    /* a purge through another replica: the tenant's epoch moved (or cannot
     * be read), so what this replica holds of it goes before any lookup */
    if (c->tier && c->pool && cp_tier_epoch_sync(c->tier, r->tenant)) {
        cp_pool_purge(c->pool, r->tenant);
        cp_admission_forget(&c->adm, r->tenant);
    }
    if (c->tier && c->pool) mark(mark_fn, mark_ctx, CP_CACHE_MARK_TIER);
    cp_status rc = lookup_local(c, r, h, err);
    if (c->pol.sharing != CP_SHARE_NONE) mark(mark_fn, mark_ctx, CP_CACHE_MARK_LOOKUP);
    int wp, ws;
    if (rc || !c->tier || !cp_cache_policy_tier(&c->pol, &wp, &ws)) return rc;
    uint8_t *skip = malloc((size_t)r->T);
    if (!skip) return cp_fail(err, CP_ENOMEM, "cache: out of memory before the tier");
    /* the tenant's own segments where its local ones left room (a shared
     * local hit does not hide a private tier one, as the local lookups
     * prefer private), then shared ones where nothing covers */
    size_t got = 0;
    const cp_matches *lists[2] = { &h->priv, &h->shared };
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0 ? !wp : !ws) continue;
        memcpy(skip, r->sensitive, (size_t)r->T);
        for (int w = 0; w <= pass; w++)
            for (size_t i = 0; i < lists[w]->n; i++) memset(skip + lists[w]->v[i].pos, 1, lists[w]->v[i].len);
        got += cp_tier_fill(c->tier, c->pool, r->tenant, r->ids, (size_t)r->T, skip, pass == 0, pass == 1);
    }
    free(skip);
    mark(mark_fn, mark_ctx, CP_CACHE_MARK_TIER);
    if (got == 0) return CP_OK;
    cp_cache_release(c, h);
    rc = lookup_local(c, r, h, err);
    mark(mark_fn, mark_ctx, CP_CACHE_MARK_LOOKUP);
    return rc;
}
