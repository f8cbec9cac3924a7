/* cp_pool_insert: the privacy check where the bytes are stored, dedup,
 * quotas, room made by eviction, the copy of the KV into slab blocks. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

static cp_status copy_kv(cp_pool *p, cp_segment *s, const cp_kv_source *src)
{
    const cp_kv_layout *l = &p->layout;
    size_t esz = cp_dtype_size(l->dtype), row = cp_kv_row(l);
    for (uint32_t b = 0; b < s->n_blocks; b++) {
        char *blk = cp_slab_block(&p->slab, s->blocks[b]);
        uint32_t t0 = b * (uint32_t)l->block_tokens, nt = s->len - t0 < (uint32_t)l->block_tokens ? s->len - t0 : (uint32_t)l->block_tokens;
        for (int layer = 0; layer < l->n_layers; layer++)
            for (int kv = 0; kv < 2; kv++) {
                const char *from = (const char *)(kv ? src->v[layer] : src->k[layer]) + (size_t)t0 * src->stride * esz;
                char *to = blk + cp_kv_block_offset(l, layer, kv, 0);
                if (src->stride == row) p->be->copy(p->be, to, from, (size_t)nt * row * esz);
                else
                    for (uint32_t t = 0; t < nt; t++) p->be->copy(p->be, to + t * row * esz, from + t * src->stride * esz, row * esz);
            }
    }
    return CP_OK;
}

/* A shared segment must not hold KV of a sensitive token: checked here,
 * where the bytes are stored, whatever the caller's annotator did.
 * *leaky = 1: the baseline stores sensitive tokens shared on purpose. */
static cp_status privacy_check(const cp_insert *in, int *leaky, cp_error *err)
{
    *leaky = 0;
    if (in->scope != CP_SCOPE_SHARED) return CP_OK; /* a private segment may hold its owner's secrets */
    if (!in->sensitive)
        return cp_fail(err, CP_EPERM, "pool insert: a shared segment of tenant %u came without its sensitive mask", in->tenant);
    for (uint32_t i = 0; i < in->len; i++)
        if (in->sensitive[i]) {
            if (in->leaky_baseline) {
                *leaky = 1;
                return CP_OK;
            }
            return cp_fail(err, CP_EPERM, "pool insert: token %u of a shared segment of tenant %u is sensitive: refused", i,
                           in->tenant);
        }
    return CP_OK;
}

static cp_status count_privacy_refusal(cp_pool *p, uint32_t tenant, cp_status rc)
{
    pthread_rwlock_wrlock(&p->lock);
    p->st.privacy_refusals++;
    pool_tenant *t = pool_tenant_get(p, tenant);
    if (t) {
        t->privacy_refusals++;
        t->insert_refusals++;
    }
    pthread_rwlock_unlock(&p->lock);
    return rc;
}

/* Room for one more segment id (write lock), before anything is evicted. */
static cp_status grow_segments(cp_pool *p, cp_error *err)
{
    if (p->n_free_slots > 0) return CP_OK;
    uint32_t cap = p->cap_segs ? p->cap_segs * 2 : 1024;
    cp_segment **v = realloc(p->segs, cap * sizeof *v);
    if (v) p->segs = v;
    uint32_t *f = v ? realloc(p->free_slots, cap * sizeof *f) : NULL;
    if (f) p->free_slots = f;
    uint32_t *h = f ? realloc(p->heap, cap * sizeof *h) : NULL;
    if (h) p->heap = h;
    uint32_t *x = h ? realloc(p->scratch, cap * sizeof *x) : NULL;
    if (x) p->scratch = x;
    if (!x) return cp_fail(err, CP_ENOMEM, "pool insert: out of memory growing the segment table");
    for (uint32_t i = p->cap_segs; i < cap; i++) p->segs[i] = NULL;
    for (uint32_t i = cap; i > p->cap_segs; i--) p->free_slots[p->n_free_slots++] = i - 1;
    p->cap_segs = cap;
    return CP_OK;
}

cp_status cp_pool_insert(cp_pool *p, const cp_insert *in, uint32_t *seg_id, int *dedup, cp_error *err)
{
    const cp_kv_layout *l = &p->layout;
    *dedup = 0;
    if (!in->fingerprint || memcmp(in->fingerprint, l->fingerprint, CP_FINGERPRINT_BYTES) != 0)
        return cp_fail(err, CP_EINVAL, "pool insert: the model fingerprint is not this pool's");
    if (in->len < (uint32_t)p->o.windows[0] || in->len > p->o.max_request_tokens)
        return cp_fail(err, CP_EINVAL, "pool insert: a segment of %u tokens is outside [%d, %zu]", in->len, p->o.windows[0],
                       p->o.max_request_tokens);
    if (in->scope != CP_SCOPE_PRIVATE && in->scope != CP_SCOPE_SHARED)
        return cp_fail(err, CP_EINVAL, "pool insert: scope %d is neither private nor shared", (int)in->scope);
    int leaky;
    cp_status rc = privacy_check(in, &leaky, err);
    if (rc) return count_privacy_refusal(p, in->tenant, rc);
    /* everything that needs no lock first */
    cp_segment *s = calloc(1, sizeof *s);
    uint32_t nb = (in->len + (uint32_t)l->block_tokens - 1) / (uint32_t)l->block_tokens;
    if (s) {
        s->tokens = malloc(in->len * sizeof *s->tokens);
        s->prefix = malloc((in->len + 1) * sizeof *s->prefix);
        s->recompute = calloc((in->len + 63) / 64, sizeof *s->recompute);
        s->blocks = malloc(nb * sizeof *s->blocks);
    }
    if (!s || !s->tokens || !s->prefix || !s->recompute || !s->blocks) {
        pool_segment_destroy(s);
        return cp_fail(err, CP_ENOMEM, "pool insert: out of memory for a %u-token segment", in->len);
    }
    memcpy(s->tokens, in->tokens, in->len * sizeof *s->tokens);
    s->len = in->len;
    s->n_blocks = nb;
    s->start_pos = in->start_pos;
    if (in->context) memcpy(s->context, in->context, sizeof s->context), s->has_context = 1;
    s->tenant = in->tenant;
    s->scope = in->scope;
    for (uint32_t i = 0; in->recompute && i < in->len; i++)
        if (in->recompute[i]) s->recompute[i / 64] |= 1ull << (i % 64);
    pool_segment_sha(p, s->tokens, s->len, s->sha);
    cp_rollhash_prefix(&p->rh, s->tokens, s->len, s->prefix);
    s->window = pool_window_of(p, s->len);
    s->key = pool_index_key(s->window, s->prefix[s->window]);

    pthread_rwlock_wrlock(&p->lock);
    double now = pool_now(p);
    if (p->o.ttl_s > 0 && now - p->last_expire > 1.0) pool_expire_locked(p, now);
    uint64_t dk = pool_dedup_key(s->sha, s->scope, s->tenant);
    pool_tenant *t = pool_tenant_get(p, in->tenant);
    if (!t) {
        rc = cp_fail(err, CP_ENOMEM, "pool insert: out of memory for tenant statistics");
        goto out;
    }
    /* every table that may grow, grown before anything is evicted (the
     * index by two keys: this segment's and a truncated victim's) */
    if ((rc = pool_grow_dedup(p, err)) || (rc = pool_grow_index(p, 2, err)) || (rc = grow_segments(p, err))) goto out;
    pool_dedup *d = pool_dedup_slot(p, dk, s->sha, s->scope, s->tenant);
    if (d->key) {
        *seg_id = d->seg;
        *dedup = 1;
        p->st.dedup_hits++;
        goto out;
    }
    if (now - t->win_start >= p->o.quota_window_s) {
        t->win_start = now;
        t->win_bytes = 0;
        t->win_segs = 0;
    }
    size_t bytes = (size_t)nb * p->slab.block_bytes;
    if ((p->o.quota_bytes && t->win_bytes + bytes > p->o.quota_bytes) ||
        (p->o.quota_segments && t->win_segs + 1 > p->o.quota_segments)) {
        p->st.quota_refusals++;
        t->insert_refusals++;
        rc = cp_fail(err, CP_ERANGE, "pool insert: tenant %u is over its insert quota for this window", in->tenant);
        goto out;
    }
    /* the attempt is charged from here on, stored or refused for room */
    t->win_bytes += bytes;
    t->win_segs++;
    /* decide everything before evicting anything */
    pool_bucket *bk = pool_bucket_slot(p, s->key);
    cp_segment *victim = NULL; /* a full bucket gives up its least valuable unpinned member */
    if (bk->key == s->key && bk->n >= (uint32_t)p->o.bucket_cap && !(victim = pool_bucket_victim(p, bk))) {
        p->st.insert_refusals++;
        t->insert_refusals++;
        rc = cp_fail(err, CP_ERANGE, "pool insert: its index bucket is full of pinned segments");
        goto out;
    }
    if (!pool_room_possible(p, nb)) { /* the victim's blocks count: it is unpinned */
        p->st.insert_refusals++;
        t->insert_refusals++;
        rc = cp_fail(err, CP_ERANGE, "pool insert: %u blocks do not fit in the budget, even after eviction", nb);
        goto out;
    }
    if (victim) {
        pool_settle(p, victim);
        pool_evict(p, victim, POOL_WHY_BUCKET);
    }
    pool_make_room(p, nb, s);
    for (uint32_t b = 0; b < nb; b++) cp_slab_alloc(&p->slab, &s->blocks[b]); /* pool_make_room freed them */
    s->id = p->free_slots[--p->n_free_slots];
    if (s->id >= p->n_segs) p->n_segs = s->id + 1;
    p->segs[s->id] = s;
    s->live = 1;
    s->created = now;
    atomic_store(&s->last_used, now);
    s->priority = pool_priority_of(p, s, 0, now);
    atomic_store(&s->touch_prio, s->priority);
    s->heap_pos = p->heap_n;
    p->heap[p->heap_n++] = s->id;
    pool_heap_up(p, s->heap_pos);
    pool_index_add(p, s); /* its bucket looked up again: evictions may have moved it */
    d = pool_dedup_slot(p, dk, s->sha, s->scope, s->tenant);
    d->key = dk;
    d->seg = s->id;
    p->dd_n++;
    if (in->kv) copy_kv(p, s, in->kv);
    t->inserts++;
    t->bytes += bytes;
    p->st.inserts++;
    p->st.sensitive_shared += (uint64_t)leaky;
    p->st.bytes_used += bytes;
    p->st.tokens += s->len;
    p->st.segments++;
    *seg_id = s->id;
    s = NULL; /* owned by the pool now */
out:
    pthread_rwlock_unlock(&p->lock);
    pool_segment_destroy(s);
    if (rc == CP_OK && in->kv) rc = p->be->sync(p->be, err);
    return rc;
}
