/* The cache manager's lifetime, hits, purge (see cache.h). */
#include "cache_internal.h"

#include <stdlib.h>
#include <string.h>

cp_status cp_cache_create(cp_model *m, cp_pool *pool, const cp_cache_opts *o, cp_cache **out, cp_error *err)
{
    *out = NULL;
    if (o->sharing != CP_SHARE_NONE && !pool) return cp_fail(err, CP_EINVAL, "cache: sharing mode %s needs a pool", cp_sharing_name(o->sharing));
    if (pool && memcmp(cp_pool_layout(pool)->fingerprint, m->fingerprint, 32) != 0)
        return cp_fail(err, CP_EINVAL, "cache: the pool was made for another model");
    if (o->admit_k < 1 || o->admit_k > 8) return cp_fail(err, CP_ERANGE, "cache: --admit-k %d is outside [1, 8]", o->admit_k);
    if (pool && cp_pool_layout(pool)->dtype != o->kv_dtype)
        return cp_fail(err, CP_EINVAL, "cache: --kv-dtype %s but the pool holds %s KV", cp_dtype_name(o->kv_dtype),
                       cp_dtype_name(cp_pool_layout(pool)->dtype));
    if (o->chunk_size < 16) return cp_fail(err, CP_ERANGE, "cache: --chunk-size %d is below 16", o->chunk_size);
    cp_cache *c = cp_calloc(1, sizeof *c, "cache", err);
    if (!c) return CP_ENOMEM;
    c->m = m, c->pool = pool, c->o = *o;
    cp_cache_policy_for(o->sharing, o->private_reuse, &c->pol);
    c->adm.k = o->admit_k;
    *out = c;
    return CP_OK;
}

void cp_cache_free(cp_cache *c)
{
    if (!c) return;
    cp_admission_free(&c->adm);
    free(c);
}

void cp_cache_set_tier(cp_cache *c, cp_tier *t) { c->tier = t; }
cp_pool *cp_cache_pool(const cp_cache *c) { return c->pool; }
const cp_cache_policy *cp_cache_policy_of(const cp_cache *c) { return &c->pol; }
int cp_cache_active(const cp_cache *c) { return c->pool && cp_cache_policy_uses_pool(&c->pol); }
int cp_cache_tiered(const cp_cache *c) { return c->tier && c->pool; }

void cp_cache_kv_layout(const cp_model *m, cp_dtype kv_dtype, cp_kv_layout *out)
{
    *out = (cp_kv_layout){ .n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads, .head_dim = m->cfg.head_dim,
                           .dtype = kv_dtype, .block_tokens = 16 };
    memcpy(out->fingerprint, m->fingerprint, sizeof out->fingerprint);
}

cp_status cp_cache_hits_create(cp_cache_hits **out, cp_error *err)
{
    *out = cp_calloc(1, sizeof **out, "cache hits", err);
    return *out ? CP_OK : CP_ENOMEM;
}

void cp_cache_release(cp_cache *c, cp_cache_hits *h)
{
    if (c && c->pool) {
        cp_pool_release(c->pool, &h->priv);
        cp_pool_release(c->pool, &h->shared);
    }
    h->priv.n = h->shared.n = 0;
}

void cp_cache_hits_free(cp_cache *c, cp_cache_hits *h)
{
    if (!h) return;
    cp_cache_release(c, h);
    cp_matches_free(&h->priv);
    cp_matches_free(&h->shared);
    free(h);
}

int cp_cache_hit_tokens(const cp_cache_hits *h)
{
    int n = 0;
    const cp_matches *lists[2] = { &h->priv, &h->shared };
    for (int w = 0; w < 2; w++)
        for (size_t i = 0; i < lists[w]->n; i++) n += (int)lists[w]->v[i].len;
    return n;
}

void cp_cache_purge_tenant(cp_cache *c, uint32_t tenant, size_t *segments, size_t *admissions, long *tier_segments)
{
    *segments = c->pool ? cp_pool_purge(c->pool, tenant) : 0;
    *admissions = cp_admission_forget(&c->adm, tenant);
    /* the tier's private keys of the tenant too (after its writes queued
     * before), and its epoch, which the other replicas read */
    long t = c->tier ? cp_tier_purge(c->tier, tenant, 5.0) : 0;
    if (tier_segments) *tier_segments = t;
}

cp_rule_prompt cp_cache_rule_prompt(const cp_cache *c, const cp_cache_req *r)
{
    return (cp_rule_prompt){ .ids = r->ids, .T = r->T, .msg = r->msg, .sensitive = r->sensitive, .bos = r->bos,
                             .fingerprint = cp_pool_layout(c->pool)->fingerprint };
}
