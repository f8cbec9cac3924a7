/* cp_pool_check: the pool's invariants, for tests. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

/* Every live key passes the filter, and stale bits stay bounded. */
static cp_status check_filter(const cp_pool *p, cp_error *err)
{
    size_t live = 0, set = 0;
    for (size_t i = 0; i < p->idx_cap; i++) {
        if (!p->idx[i].key) continue;
        live++;
        if (!pool_key_maybe(p, p->idx[i].key)) return cp_fail(err, CP_ERANGE, "index key %zu is missing from the filter", i);
    }
    if (live != p->idx_n) return cp_fail(err, CP_ERANGE, "the index holds %zu keys, idx_n says %zu", live, p->idx_n);
    if (live * 2 > p->idx_cap) return cp_fail(err, CP_ERANGE, "the index holds %zu keys in %zu buckets: over half full", live, p->idx_cap);
    for (size_t w = 0; w < POOL_KEY_BITS / 64; w++) set += (size_t)__builtin_popcountll(p->key_bits[w]);
    size_t bound = live > POOL_FILTER_REBUILD_MIN ? live : POOL_FILTER_REBUILD_MIN;
    if (p->key_removals > bound || set > live + p->key_removals)
        return cp_fail(err, CP_ERANGE, "the key filter has %zu bits set for %zu live keys and %zu removed since its rebuild", set, live,
                       p->key_removals);
    return CP_OK;
}

/* A live segment is what inserting its tokens alone would make: blocks for
 * its length, its hash, window, index key, and its own dedup entry (what a
 * truncation must re-key). */
static cp_status check_identity(const cp_pool *p, const cp_segment *s, cp_error *err)
{
    uint32_t bt = (uint32_t)p->layout.block_tokens;
    if (s->n_blocks != (s->len + bt - 1) / bt)
        return cp_fail(err, CP_ERANGE, "segment %u holds %u blocks for %u tokens", s->id, s->n_blocks, s->len);
    if (!s->live) return CP_OK; /* purged: out of the index and the dedup table already */
    uint8_t sha[32];
    pool_segment_sha(p, s->tokens, s->len, sha);
    if (memcmp(sha, s->sha, 32) != 0) return cp_fail(err, CP_ERANGE, "segment %u: its hash is not that of its %u tokens", s->id, s->len);
    if (s->window != pool_window_of(p, s->len) || s->key != pool_index_key(s->window, s->prefix[s->window]))
        return cp_fail(err, CP_ERANGE, "segment %u: window %d and key are not those of its %u tokens", s->id, s->window, s->len);
    const pool_dedup *d = pool_dedup_slot(p, pool_dedup_key(s->sha, s->scope, s->tenant), s->sha, s->scope, s->tenant);
    if (d->key == 0 || d->seg != s->id) return cp_fail(err, CP_ERANGE, "segment %u is not its own dedup entry", s->id);
    return CP_OK;
}

cp_status cp_pool_check(cp_pool *p, cp_error *err)
{
    pthread_rwlock_wrlock(&p->lock);
    cp_status rc = CP_OK;
    uint8_t *owner = calloc(p->slab.n_blocks, 1);
    size_t bytes = 0, live = 0, pinned = 0, dead = 0, tokens = 0;
    if (!owner) rc = cp_fail(err, CP_ENOMEM, "pool check: out of memory");
    for (uint32_t i = 0; rc == CP_OK && i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (!s) continue;
        live++;
        dead += !s->live;
        if (!s->live && atomic_load(&s->refcount) <= 0) rc = cp_fail(err, CP_ERANGE, "purged segment %u outlived its pins", i);
        bytes += pool_seg_bytes(p, s);
        tokens += s->len;
        if (atomic_load(&s->refcount) < 0) rc = cp_fail(err, CP_ERANGE, "segment %u has refcount %d", i, atomic_load(&s->refcount));
        if (atomic_load(&s->refcount) > 0) pinned += s->n_blocks;
        if (atomic_load(&s->touch_prio) < s->priority) rc = cp_fail(err, CP_ERANGE, "segment %u lost the priority of its hits", i);
        if (rc == CP_OK) rc = check_identity(p, s, err);
        if (s->heap_pos >= p->heap_n || p->heap[s->heap_pos] != i) rc = cp_fail(err, CP_ERANGE, "segment %u is not in the heap", i);
        for (uint32_t b = 0; rc == CP_OK && b < s->n_blocks; b++) {
            uint32_t id = s->blocks[b];
            if (id >= p->slab.n_blocks || !p->slab.in_use[id]) rc = cp_fail(err, CP_ERANGE, "segment %u holds free block %u", i, id);
            else if (owner[id]++) rc = cp_fail(err, CP_ERANGE, "block %u belongs to two segments", id);
        }
        if (rc == CP_OK && s->window) {
            const pool_bucket *bk = pool_bucket_find(p, s->key);
            int in = 0;
            for (uint32_t j = 0; bk && j < bk->n; j++) in |= bk->ids[j] == i;
            if (!in) rc = cp_fail(err, CP_ERANGE, "segment %u is missing from its index bucket", i);
        }
    }
    if (rc == CP_OK) {
        uint32_t used = 0;
        for (uint32_t b = 0; b < p->slab.n_blocks; b++) {
            used += p->slab.in_use[b];
            if (p->slab.in_use[b] && !owner[b]) rc = cp_fail(err, CP_ERANGE, "block %u is used by no segment (leak)", b);
        }
        if (rc == CP_OK && used + p->slab.n_free != p->slab.n_blocks) rc = cp_fail(err, CP_ERANGE, "free list and flags disagree");
        if (rc == CP_OK && bytes != p->st.bytes_used)
            rc = cp_fail(err, CP_ERANGE, "bytes_used %zu != sum of live segments %zu", p->st.bytes_used, bytes);
        if (rc == CP_OK && tokens != p->st.tokens)
            rc = cp_fail(err, CP_ERANGE, "stats count %zu tokens, the segments hold %zu", p->st.tokens, tokens);
        if (rc == CP_OK && bytes != cp_slab_used_bytes(&p->slab))
            rc = cp_fail(err, CP_ERANGE, "slab holds %zu bytes, segments %zu", cp_slab_used_bytes(&p->slab), bytes);
        if (rc == CP_OK && (live != p->st.segments || live != p->heap_n || live - dead != p->dd_n))
            rc = cp_fail(err, CP_ERANGE, "%zu live segments (%zu purged), stats %zu, heap %zu, dedup %zu", live, dead, p->st.segments,
                         p->heap_n, p->dd_n);
        for (size_t i = 1; rc == CP_OK && i < p->heap_n; i++)
            if (pool_heap_less(p, i, (i - 1) / 2)) rc = cp_fail(err, CP_ERANGE, "heap order broken at %zu", i);
        for (size_t i = 0; rc == CP_OK && i < p->idx_cap; i++)
            for (uint32_t j = 0; rc == CP_OK && p->idx[i].key && j < p->idx[i].n; j++) {
                const cp_segment *s = p->idx[i].ids[j] < p->n_segs ? p->segs[p->idx[i].ids[j]] : NULL;
                if (!s || s->key != p->idx[i].key) rc = cp_fail(err, CP_ERANGE, "index bucket %zu names a dead or foreign segment", i);
            }
        for (size_t i = 0; rc == CP_OK && i < p->idx_cap; i++)
            if (p->idx[i].key && p->idx[i].n > (uint32_t)p->o.bucket_cap)
                rc = cp_fail(err, CP_ERANGE, "index bucket %zu holds %u segments, over its cap of %d", i, p->idx[i].n, p->o.bucket_cap);
        if (rc == CP_OK && pinned != atomic_load(&p->pinned_blocks))
            rc = cp_fail(err, CP_ERANGE, "pinned segments hold %zu blocks, the count says %u", pinned, atomic_load(&p->pinned_blocks));
        rc = rc ? rc : check_filter(p, err);
    }
    free(owner);
    pthread_rwlock_unlock(&p->lock);
    return rc;
}
