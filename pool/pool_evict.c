/* Eviction: the priority heap (GDSF or LRU) and the priority hits earn,
 * victims in policy order (the last giving up only the tail blocks an insert
 * needs), a full bucket's victim, expiry past the TTL. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

/* ---- eviction heap ------------------------------------------------------- */

int pool_heap_less(const cp_pool *p, size_t a, size_t b)
{
    const cp_segment *x = p->segs[p->heap[a]], *y = p->segs[p->heap[b]];
    return x->priority < y->priority || (x->priority == y->priority && x->id < y->id);
}

static void heap_swap(cp_pool *p, size_t a, size_t b)
{
    uint32_t t = p->heap[a];
    p->heap[a] = p->heap[b];
    p->heap[b] = t;
    p->segs[p->heap[a]]->heap_pos = a;
    p->segs[p->heap[b]]->heap_pos = b;
}

void pool_heap_up(cp_pool *p, size_t i)
{
    while (i > 0 && pool_heap_less(p, i, (i - 1) / 2)) {
        heap_swap(p, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(cp_pool *p, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < p->heap_n && pool_heap_less(p, l, m)) m = l;
        if (r < p->heap_n && pool_heap_less(p, r, m)) m = r;
        if (m == i) return;
        heap_swap(p, i, m);
        i = m;
    }
}

static void heap_remove(cp_pool *p, cp_segment *s)
{
    size_t i = s->heap_pos;
    heap_swap(p, i, p->heap_n - 1);
    p->heap_n--;
    if (i < p->heap_n) {
        pool_heap_up(p, i);
        heap_down(p, i);
    }
}

/* The eviction priority a segment has after `hits` hits, the latest at
 * `last_used`.  GreedyDual-Size-Frequency: the inflation clock (the
 * priority of the latest segment evicted, so what was valuable long ago
 * ages out) + frequency x tokens saved / bytes held (a segment that wastes
 * half a block is worth less per byte). */
double pool_priority_of(const cp_pool *p, const cp_segment *s, uint64_t hits, double last_used)
{
    if (p->o.policy == CP_EVICT_LRU) return last_used;
    double value = (double)(hits + 1) * s->len;
    return p->gdsf_clock + value / (double)pool_seg_bytes(p, s) * 1e3;
}

/* Under the read lock, so the clock cannot move meanwhile; concurrent hits
 * on one segment each raise its recency and priority to at least their own
 * (both only grow with hits and time, so the max is the latest). */
void pool_touch(cp_pool *p, cp_segment *s, double now)
{
    uint64_t hits = atomic_fetch_add_explicit(&s->hits, 1, memory_order_relaxed) + 1;
    pool_atomic_max(&s->last_used, now);
    pool_atomic_max(&s->touch_prio, pool_priority_of(p, s, hits, now));
}

/* Under the write lock: moves the priority hits earned into the heap key.
 * 1 if it changed (the segment sank in the heap).  Hits only raise a
 * priority, so a heap top that needs no settling is the true minimum. */
int pool_settle(cp_pool *p, cp_segment *s)
{
    double t = atomic_load_explicit(&s->touch_prio, memory_order_relaxed);
    if (t <= s->priority) return 0;
    s->priority = t;
    heap_down(p, s->heap_pos);
    return 1;
}

static double effective_priority(const cp_segment *s)
{
    double t = atomic_load_explicit(&s->touch_prio, memory_order_relaxed);
    return t > s->priority ? t : s->priority;
}

/* Never called on a pinned segment.  For the GDSF clock, a victim chosen by
 * priority has been settled first. */
void pool_evict(cp_pool *p, cp_segment *s, pool_evict_why why)
{
    pool_index_remove(p, s);
    pool_dedup_remove(p, s);
    heap_remove(p, s);
    if (why != POOL_WHY_PURGE) { /* an erasure is no eviction: the GDSF clock does not age on it */
        if (why != POOL_WHY_TTL && p->o.policy == CP_EVICT_GDSF && s->priority > p->gdsf_clock) p->gdsf_clock = s->priority;
    }
    size_t bytes = pool_seg_bytes(p, s);
    if (s->scope == CP_SCOPE_PRIVATE) pool_zero_blocks(p, s); /* before the blocks are free to reuse */
    for (uint32_t b = 0; b < s->n_blocks; b++) cp_slab_release(&p->slab, s->blocks[b]);
    pool_tenant *t = pool_tenant_get(p, s->tenant);
    if (t) {
        t->bytes -= bytes;
        t->evictions++;
    }
    p->st.bytes_used -= bytes;
    p->st.tokens -= s->len;
    p->st.segments--;
    if (why == POOL_WHY_LRU) p->st.evictions_lru++;
    else if (why == POOL_WHY_GDSF) p->st.evictions_gdsf++;
    else if (why == POOL_WHY_TTL) p->st.evictions_ttl++;
    else if (why == POOL_WHY_BUCKET) p->st.evictions_bucket++;
    if (why == POOL_WHY_PURGE && t) t->evictions--; /* erased on request, not evicted */
    p->segs[s->id] = NULL;
    p->free_slots[p->n_free_slots++] = s->id;
    pool_segment_destroy(s);
}

/* does segment a have hash sha in b's scope (and, private, b's owner)? */
static int same_identity(const cp_segment *a, const uint8_t sha[32], const cp_segment *b)
{
    return memcmp(a->sha, sha, 32) == 0 && a->scope == b->scope && (a->scope == CP_SCOPE_SHARED || a->tenant == b->tenant);
}

/* Tail-block eviction: unpinned, live victim s gives up its last k blocks
 * (k < its blocks) and stays as the segment of its first tokens.  Every
 * check comes before any change; 0 (nothing changed) when it must go whole
 * instead: too short a remainder, the remainder already stored or the very
 * segment being inserted (a second copy would hold blocks for nothing, and
 * the dedup table keeps one entry per identity), or its new bucket full
 * counting the insert's place in it.  What is decided here depends on
 * sizes, the windows, and the victim's own scope and tokens (as an insert's
 * dedup does), never on whether its tokens are sensitive. */
static int truncate_tail(cp_pool *p, cp_segment *s, uint32_t k, const cp_segment *incoming)
{
    uint32_t bt = (uint32_t)p->layout.block_tokens, nb = s->n_blocks - k, len = nb * bt;
    if (p->o.whole_eviction || !s->live || k >= s->n_blocks || len >= s->len || len < (uint32_t)p->o.windows[0]) return 0;
    int win = pool_window_of(p, len);
    uint64_t key = pool_index_key(win, s->prefix[win]);
    uint8_t sha[32];
    pool_segment_sha(p, s->tokens, len, sha);
    uint64_t dk = pool_dedup_key(sha, s->scope, s->tenant);
    /* already stored (s's own dedup entry has the old hash: it does not match), or the insert itself */
    if (pool_dedup_slot(p, dk, sha, s->scope, s->tenant)->key || same_identity(incoming, sha, s)) return 0;
    /* a new key moves it to another bucket (or a new one: the insert grew the index for it) */
    const pool_bucket *bk = key == s->key ? NULL : pool_bucket_slot(p, key);
    uint32_t taken = bk && bk->key == key ? bk->n : 0;
    if (bk && taken + (key == incoming->key) >= (uint32_t)p->o.bucket_cap) return 0;
    /* the tail's blocks: zeroed (private) before the slab may hand them out */
    for (uint32_t b = nb; b < s->n_blocks; b++) {
        void *blk = cp_slab_block(&p->slab, s->blocks[b]);
        if (s->scope == CP_SCOPE_PRIVATE) p->be->zero(p->be, blk, p->slab.block_bytes);
        cp_slab_release(&p->slab, s->blocks[b]);
    }
    /* re-keyed as the shorter segment: dedup by its new hash, indexed by its new first window */
    pool_dedup_remove(p, s);
    memcpy(s->sha, sha, sizeof sha);
    pool_dedup *d = pool_dedup_slot(p, dk, s->sha, s->scope, s->tenant);
    d->key = dk;
    d->seg = s->id;
    p->dd_n++;
    if (key != s->key) {
        pool_index_remove(p, s);
        s->key = key;
        pool_index_add(p, s);
    }
    s->window = win;
    size_t freed = (size_t)k * p->slab.block_bytes;
    p->st.tokens -= s->len - len;
    s->len = len; /* tokens, prefix hashes and recompute flags past it are never read again */
    s->n_blocks = nb;
    pool_tenant *t = pool_tenant_get(p, s->tenant);
    if (t) t->bytes -= freed;
    p->st.bytes_used -= freed;
    p->st.truncations++;
    p->st.truncated_blocks += k;
    /* the clock ages as on an eviction (the tail went at the victim's
     * priority); the victim keeps its priority, so it stays at the top of
     * the heap and the next insert that needs room takes from it first */
    if (p->o.policy == CP_EVICT_GDSF && s->priority > p->gdsf_clock) p->gdsf_clock = s->priority;
    return 1;
}

/* Can `need` blocks be had by evicting unpinned segments?  Exact: under the
 * write lock no pin changes, so pinned_blocks is what it says. */
int pool_room_possible(const cp_pool *p, uint32_t need)
{
    uint32_t used = p->slab.n_blocks - p->slab.n_free;
    uint32_t evictable = used - atomic_load(&p->pinned_blocks);
    return need <= p->slab.n_free + evictable;
}

/* Evicts unpinned segments in policy order until `need` blocks are free,
 * the last one only by its tail when that is enough (truncate_tail): so
 * exactly `need` are free after it, not up to a victim's size more.
 * Called only after pool_room_possible said yes, so it never stops half way
 * (an insert that cannot fit evicts nothing), and after pool_grow_index made
 * room for the one key a truncation may add. */
void pool_make_room(cp_pool *p, uint32_t need, const cp_segment *incoming)
{
    size_t n_pinned = 0;
    while (p->slab.n_free < need && p->heap_n > 0) {
        cp_segment *s = p->segs[p->heap[0]];
        if (pool_settle(p, s)) continue; /* hits raised it: look at the new top */
        if (atomic_load(&s->refcount) > 0) { /* pinned: set aside, never evicted */
            p->scratch[n_pinned++] = s->id;
            heap_remove(p, s);
            continue;
        }
        if (truncate_tail(p, s, need - p->slab.n_free, incoming)) break;
        pool_evict(p, s, p->o.policy == CP_EVICT_LRU ? POOL_WHY_LRU : POOL_WHY_GDSF);
    }
    for (size_t i = 0; i < n_pinned; i++) { /* back into the heap */
        cp_segment *s = p->segs[p->scratch[i]];
        s->heap_pos = p->heap_n;
        p->heap[p->heap_n++] = s->id;
        pool_heap_up(p, s->heap_pos);
    }
}

size_t pool_expire_locked(cp_pool *p, double now)
{
    if (p->o.ttl_s <= 0) return 0;
    size_t n = 0;
    for (uint32_t i = 0; i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (s && atomic_load(&s->refcount) == 0 && now - atomic_load(&s->last_used) > p->o.ttl_s) {
            pool_evict(p, s, POOL_WHY_TTL);
            n++;
        }
    }
    p->last_expire = now;
    return n;
}

/* The unpinned member of a full bucket that gives way, or NULL. */
cp_segment *pool_bucket_victim(cp_pool *p, const pool_bucket *bk)
{
    cp_segment *victim = NULL;
    for (uint32_t i = 0; i < bk->n; i++) {
        cp_segment *c = p->segs[bk->ids[i]];
        if (atomic_load(&c->refcount) > 0) continue; /* in use by a request: never */
        if (!victim || effective_priority(c) < effective_priority(victim)) victim = c;
    }
    return victim;
}
