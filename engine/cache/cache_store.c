/* Storage of a request's segments: scopes, admission, context hashes,
 * quotas, the pool's insert and the tier's write-through (see cache.h). */
#include "cache_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

cp_status cp_cache_writer_open(cp_cache *c, const cp_cache_req *r, const uint8_t *state, const uint8_t *exact, const uint8_t *shared_hit,
                               cp_cache_writer **out, cp_error *err)
{
    cp_cache_writer *w = cp_calloc(1, sizeof *w, "cache writer", err);
    if (!w) return *out = NULL, CP_ENOMEM;
    *w = (cp_cache_writer){ .c = c, .r = *r, .state = state, .exact = exact, .shared_hit = shared_hit };
    /* what the pool holds as shared of this prompt, as its segments are stored in order */
    if (c->pol.segments && !(w->held_shared = malloc((size_t)r->T))) {
        free(w);
        return *out = NULL, cp_fail(err, CP_ENOMEM, "cache: out of memory opening a store");
    }
    if (w->held_shared) memcpy(w->held_shared, shared_hit, (size_t)r->T);
    *out = w;
    return CP_OK;
}

void cp_cache_writer_close(cp_cache_writer *w, int *segments, int *shared, int *private_)
{
    *segments = *shared = *private_ = 0;
    if (!w) return;
    *segments = w->segments, *shared = w->shared, *private_ = w->private_;
    free(w->held_shared);
    free(w);
}

/* Whether a segment [start, start + len) of this request may carry its
 * context hash (cp_rule_may_vouch over what this request holds), and,
 * under --admit-k, whether k distinct tenants produced that whole prefix
 * (as a shared segment itself must be: each tenant that gets this far is
 * counted, private segments' too).  A prefix that held a secret, or (before
 * a shared segment) text the pool holds only privately, is never vouched
 * for, so no proof ever compares one. */
static int may_vouch(cp_cache_writer *w, int start, int len, cp_scope scope)
{
    uint8_t *kv_exact = malloc((size_t)(start + len));
    if (!kv_exact) return 0; /* out of memory: no context, which only costs recompute */
    for (int t = 0; t < start + len; t++) kv_exact[t] = w->state[t] == CP_CACHE_FRESH || w->exact[t];
    cp_rule_prompt p = cp_cache_rule_prompt(w->c, &w->r);
    int ok = (w->held_shared || scope != CP_SCOPE_SHARED) &&
             cp_rule_may_vouch(&p, kv_exact, w->held_shared, w->r.eligible, start, len, scope == CP_SCOPE_SHARED);
    free(kv_exact);
    if (!ok) return 0;
    int k_tenants = cp_admission_record(&w->c->adm, w->r.tenant, w->r.ids, start + len);
    return scope != CP_SCOPE_SHARED || k_tenants;
}

/* One insert in one scope; *held = 1 when the pool holds it afterwards
 * (stored, or found already there), 0 when refused.
 * sens: the sensitive mask of tokens[start, start + len), for the pool to check
 * chain: tokens is this request's own prompt, so the segment's context hash may be stored (may_vouch) */
static cp_status insert_in(cp_cache_writer *w, cp_state *st, const int32_t *tokens, int start, int len, int32_t start_pos,
                           const uint8_t *recompute, cp_scope scope, const uint8_t *sens, int chain, int *held, cp_error *err)
{
    cp_cache *c = w->c;
    const cp_kv_layout *l = cp_pool_layout(c->pool);
    int L = c->m->cfg.n_layers;
    size_t kvd = cp_kv_row(l);
    const void *kp[CP_MAX_LAYERS], *vp[CP_MAX_LAYERS];
    for (int i = 0; i < L; i++) { /* the state's dtype is the pool's (cp_cache_create checks) */
        kp[i] = cp_state_kv_row(c->m, st, 0, i, start);
        vp[i] = cp_state_kv_row(c->m, st, 1, i, start);
    }
    cp_kv_source src = { kp, vp, kvd };
    uint8_t ctx[32];
    int vouch = chain && start == start_pos && may_vouch(w, start, len, scope);
    if (vouch) cp_rule_context_hash(l->fingerprint, tokens, start, ctx);
    *held = 0;
    cp_insert in = { .tenant = w->r.tenant, .scope = scope, .fingerprint = l->fingerprint, .tokens = tokens + start,
                     .len = (uint32_t)len, .start_pos = start_pos, .recompute = recompute, .context = vouch ? ctx : NULL, .sensitive = sens,
                     .leaky_baseline = c->pol.leaky, .kv = &src };
    uint32_t id;
    int dd;
    cp_error ierr = { 0 };
    int wp, ws, tiered = c->tier && cp_cache_policy_tier(&c->pol, &wp, &ws);
    /* the tenant's quota across every replica on the tier (the pool's own holds per process) */
    size_t bytes = (size_t)len * kvd * cp_dtype_size(l->dtype) * 2 * (size_t)L;
    if (tiered && !cp_tier_quota_allow(c->tier, w->r.tenant, bytes)) return CP_OK; /* refused: still served */
    cp_status rc = cp_pool_insert(c->pool, &in, &id, &dd, &ierr);
    if (rc == CP_ERANGE || rc == CP_EINVAL) return CP_OK; /* refused (budget, quota, too short): still served */
    if (rc) return cp_fail(err, rc, "%s", ierr.msg);
    *held = 1;
    if (!dd && tiered) { /* write-through, queued: the writer thread talks to Redis */
        cp_tier_quota_charge(c->tier, w->r.tenant, bytes);
        cp_tier_write tw = { .tenant = w->r.tenant, .scope = scope, .tokens = tokens + start, .len = (uint32_t)len,
                             .start_pos = start_pos, .recompute = recompute, .sensitive = sens, .kv = &src };
        cp_tier_put(c->tier, &tw);
    }
    if (!dd) {
        w->segments++;
        if (scope == CP_SCOPE_SHARED) w->shared++;
        else w->private_++;
    }
    return CP_OK;
}

/* Stores a segment in the scopes the rule gives it (cp_rule_store_scopes:
 * under --admit-k the producer's private copy, and the shared one once k
 * tenants produced it); a shared one this request's prompt holds marks its
 * tokens held_shared, for the context hashes of the segments after it. */
static cp_status insert(cp_cache_writer *w, cp_state *st, const int32_t *tokens, int start, int len, int32_t start_pos,
                        const uint8_t *recompute, cp_scope scope, const uint8_t *sens, int chain, cp_error *err)
{
    cp_cache *c = w->c;
    int want_shared = scope == CP_SCOPE_SHARED, to_private, to_shared, held = 0;
    int adm = want_shared && cp_admission_record(&c->adm, w->r.tenant, tokens + start, len);
    int own_lookup = c->pol.lookup_private;
    cp_rule_store_scopes(want_shared, c->o.admit_k, adm, own_lookup, &to_private, &to_shared);
    cp_status rc = CP_OK;
    if (to_private) rc = insert_in(w, st, tokens, start, len, start_pos, recompute, CP_SCOPE_PRIVATE, sens, chain, &held, err);
    if (rc == CP_OK && to_shared) rc = insert_in(w, st, tokens, start, len, start_pos, recompute, CP_SCOPE_SHARED, sens, chain, &held, err);
    if (rc == CP_OK && to_shared && held && chain && w->held_shared) memset(w->held_shared + start, 1, (size_t)len);
    return rc;
}

/* chunks from the start of each message; a chunk with a sensitive token,
 * or one already reused, is not stored */
static cp_status store_chunks(cp_cache_writer *w, cp_state *st, cp_error *err)
{
    const cp_cache_req *r = &w->r;
    const int32_t *ids = r->ids;
    int T = r->T, size = w->c->o.chunk_size;
    cp_status rc = CP_OK;
    uint8_t *rec = malloc((size_t)size);
    if (!rec) return cp_fail(err, CP_ENOMEM, "cache: out of memory storing chunks");
    for (int i = 0; i < T && rc == CP_OK;) {
        int j = i + 1;
        while (j < T && r->msg[j] == r->msg[i]) j++;
        for (int a = i; a < j && rc == CP_OK; a += size) {
            int len = j - a < size ? j - a : size, clean = 1;
            for (int t = a; t < a + len; t++) clean &= !r->sensitive[t] && w->state[t] == CP_CACHE_FRESH;
            if (!clean || len < 16) continue;
            int nrec = (int)ceil(w->c->o.chunk_recompute * len);
            for (int t = 0; t < len; t++) rec[t] = t < nrec; /* the chunk's head loses its context most */
            rc = insert(w, st, ids, a, len, a, rec, CP_SCOPE_SHARED, r->sensitive + a, 0, err);
        }
        i = j;
    }
    free(rec);
    return rc;
}

cp_status cp_cache_store_prompt(cp_cache_writer *w, cp_state *st, cp_error *err)
{
    const int32_t *ids = w->r.ids;
    const uint8_t *mask = w->r.sensitive;
    int T = w->r.T;
    switch (w->c->pol.prompt_store) {
    case CP_PROMPT_STORE_NONE: return CP_OK;
    case CP_PROMPT_STORE_PRIVATE_BLOCKS:
        return T / 16 * 16 >= 16 ? insert(w, st, ids, 0, T / 16 * 16, 0, NULL, CP_SCOPE_PRIVATE, mask, 0, err) : CP_OK;
    case CP_PROMPT_STORE_SHARED: return T >= 16 ? insert(w, st, ids, 0, T, 0, NULL, CP_SCOPE_SHARED, mask, 0, err) : CP_OK;
    case CP_PROMPT_STORE_PRIVATE: return T >= 16 ? insert(w, st, ids, 0, T, 0, NULL, CP_SCOPE_PRIVATE, mask, 0, err) : CP_OK;
    case CP_PROMPT_STORE_CHUNKS: return store_chunks(w, st, err);
    }
    return CP_OK;
}

cp_status cp_cache_store_segment(cp_cache_writer *w, cp_state *st, const int32_t *tokens, int start, int len, const uint8_t *recompute,
                                 int off, int own_kv, cp_error *err)
{
    if (!w->c->pol.segments) return CP_OK;
    int shared = 1;
    for (int t = 0; t < len; t++) shared &= w->r.eligible[start + off + t];
    return insert(w, st, tokens, start, len, start, recompute, shared ? CP_SCOPE_SHARED : CP_SCOPE_PRIVATE, w->r.sensitive + start + off,
                  own_kv && off == 0, err);
}
