/* The segment store: insert with dedup and quotas, the index, eviction. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool_internal.h"

#include "../kernels/clock.h"

void cp_pool_opts_default(cp_pool_opts *o)
{
    memset(o, 0, sizeof *o);
    o->budget_bytes = (size_t)1 << 30;
    o->policy = CP_EVICT_GDSF;
    o->windows[0] = 16, o->windows[1] = 32, o->windows[2] = 64, o->windows[3] = 128;
    o->n_windows = 4;
    o->bucket_cap = CP_POOL_BUCKET_CAP;
    o->max_request_tokens = (size_t)1 << 20;
    o->quota_window_s = 60;
}

double pool_now(const cp_pool *p) { return p->o.clock ? p->o.clock(p->o.clock_ctx) : cp_now_s(); }

uint64_t pool_index_key(int window, uint64_t hash)
{
    uint64_t k = hash * 0x9e3779b97f4a7c15ull ^ ((uint64_t)window << 56 | (uint64_t)window);
    return k ? k : 1; /* 0 marks an empty slot */
}

/* ---- eviction heap ------------------------------------------------------- */

static int heap_less(const cp_pool *p, size_t a, size_t b)
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

static void heap_up(cp_pool *p, size_t i)
{
    while (i > 0 && heap_less(p, i, (i - 1) / 2)) {
        heap_swap(p, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(cp_pool *p, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < p->heap_n && heap_less(p, l, m)) m = l;
        if (r < p->heap_n && heap_less(p, r, m)) m = r;
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
        heap_up(p, i);
        heap_down(p, i);
    }
}

static size_t seg_bytes(const cp_pool *p, const cp_segment *s) { return (size_t)s->n_blocks * p->slab.block_bytes; }

/* The eviction priority a segment has after `hits` hits, the latest at
 * `last_used`.  GreedyDual-Size-Frequency: the inflation clock (the
 * priority of the latest segment evicted, so what was valuable long ago
 * ages out) + frequency x tokens saved / bytes held (a segment that wastes
 * half a block is worth less per byte). */
static double priority_of(const cp_pool *p, const cp_segment *s, uint64_t hits, double last_used)
{
    if (p->o.policy == CP_EVICT_LRU) return last_used;
    double value = (double)(hits + 1) * s->len;
    return p->gdsf_clock + value / (double)seg_bytes(p, s) * 1e3;
}

/* Under the read lock, so the clock cannot move meanwhile; concurrent hits
 * on one segment each raise its recency and priority to at least their own
 * (both only grow with hits and time, so the max is the latest). */
void pool_touch(cp_pool *p, cp_segment *s, double now)
{
    uint64_t hits = atomic_fetch_add_explicit(&s->hits, 1, memory_order_relaxed) + 1;
    pool_atomic_max(&s->last_used, now);
    pool_atomic_max(&s->touch_prio, priority_of(p, s, hits, now));
}

/* Under the write lock: moves the priority hits earned into the heap key.
 * 1 if it changed (the segment sank in the heap).  Hits only raise a
 * priority, so a heap top that needs no settling is the true minimum. */
static int settle(cp_pool *p, cp_segment *s)
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

/* ---- index and dedup tables ---------------------------------------------- */

/* Both are open-addressing tables (linear probing, power-of-two capacity)
 * of entries that begin with a uint64_t key, 0 = empty.  What differs is
 * how an entry finds its slot: `place` puts one into its slot of the table
 * as it is now.  What is shared is below: refilling a grown table, and
 * erasing without breaking a probe chain. */
typedef void (*place_fn)(cp_pool *p, const void *entry);

static uint64_t entry_key(const void *tab, size_t size, size_t i) { return *(const uint64_t *)((const char *)tab + i * size); }

/* the occupied entries of the table being replaced, into the new one */
static void table_refill(cp_pool *p, const void *old, size_t old_cap, size_t size, place_fn place)
{
    for (size_t i = 0; i < old_cap; i++)
        if (entry_key(old, size, i)) place(p, (const char *)old + i * size);
}

/* Empties slot i, then places the rest of its cluster again, so no probe
 * for a later entry stops at the hole. */
static void table_erase(cp_pool *p, void *tab, size_t cap, size_t size, size_t i, place_fn place)
{
    union { pool_bucket b; pool_dedup d; } tmp;
    char *t = tab;
    memset(t + i * size, 0, size);
    for (size_t j = (i + 1) & (cap - 1); entry_key(t, size, j); j = (j + 1) & (cap - 1)) {
        memcpy(&tmp, t + j * size, size);
        memset(t + j * size, 0, sizeof(uint64_t));
        place(p, &tmp);
    }
}

static pool_bucket *bucket_slot(const cp_pool *p, uint64_t key)
{
    size_t mask = p->idx_cap - 1;
    for (size_t i = key & mask;; i = (i + 1) & mask)
        if (p->idx[i].key == key || p->idx[i].key == 0) return &p->idx[i];
}

static void key_bit_set(cp_pool *p, uint64_t key)
{
    uint64_t b = (key >> 20) & (POOL_KEY_BITS - 1);
    p->key_bits[b >> 6] |= 1ull << (b & 63);
}

const pool_bucket *pool_bucket_find(const cp_pool *p, uint64_t key)
{
    if (p->idx_cap == 0 || !pool_key_maybe(p, key)) return NULL;
    const pool_bucket *b = bucket_slot(p, key);
    return b->key == key ? b : NULL;
}

static void place_bucket(cp_pool *p, const void *entry)
{
    const pool_bucket *b = entry;
    *bucket_slot(p, b->key) = *b;
    key_bit_set(p, b->key);
}

/* The filter again from the live keys alone: the bits of removed keys drop out. */
static void filter_rebuild(cp_pool *p)
{
    memset(p->key_bits, 0, POOL_KEY_BITS / 8);
    for (size_t i = 0; i < p->idx_cap; i++)
        if (p->idx[i].key) key_bit_set(p, p->idx[i].key);
    p->key_removals = 0;
}

/* Room for `extra` more keys at a load of at most 1/2. */
static cp_status grow_index(cp_pool *p, size_t extra, cp_error *err)
{
    if ((p->idx_n + extra) * 2 <= p->idx_cap) return CP_OK;
    size_t cap = p->idx_cap ? p->idx_cap * 2 : 1024;
    while ((p->idx_n + extra) * 2 > cap) cap *= 2;
    pool_bucket *old = p->idx;
    size_t old_cap = p->idx_cap;
    p->idx = calloc(cap, sizeof *p->idx);
    if (!p->idx) {
        p->idx = old;
        return cp_fail(err, CP_ENOMEM, "pool: out of memory growing the index to %zu buckets", cap);
    }
    p->idx_cap = cap;
    table_refill(p, old, old_cap, sizeof *old, place_bucket);
    free(old);
    filter_rebuild(p);
    return CP_OK;
}

static void bucket_delete(cp_pool *p, pool_bucket *b)
{
    p->idx_n--;
    table_erase(p, p->idx, p->idx_cap, sizeof *b, (size_t)(b - p->idx), place_bucket);
    /* its bit stays set (another live key may share it); under churn at a
     * steady size the index never grows, so without this the filter would
     * fill up and pass every probe */
    p->key_removals++;
    if (p->key_removals > p->idx_n && p->key_removals > POOL_FILTER_REBUILD_MIN) filter_rebuild(p);
}

static void index_remove(cp_pool *p, cp_segment *s)
{
    if (!s->window) return;
    pool_bucket *b = bucket_slot(p, s->key);
    if (b->key != s->key) return;
    for (uint32_t i = 0; i < b->n; i++)
        if (b->ids[i] == s->id) {
            b->ids[i] = b->ids[--b->n];
            break;
        }
    if (b->n == 0) bucket_delete(p, b);
    s->window = 0;
}

/* Into the bucket of its key (made if new).  The caller made room
 * (grow_index) and checked the bucket is not full. */
static void index_add(cp_pool *p, cp_segment *s)
{
    pool_bucket *bk = bucket_slot(p, s->key);
    if (bk->key == 0) {
        bk->key = s->key;
        bk->n = 0;
        p->idx_n++;
        key_bit_set(p, s->key);
    }
    bk->ids[bk->n++] = s->id;
}

/* The index window of a segment of len tokens: the largest that fits, 0 if none. */
static int window_of(const cp_pool *p, uint32_t len)
{
    int w = 0;
    for (int i = 0; i < p->o.n_windows; i++)
        if (p->o.windows[i] <= (int)len) w = p->o.windows[i];
    return w;
}

/* SHA-256(fingerprint || token ids): a segment's identity, for dedup and full matches. */
static void segment_sha(const cp_pool *p, const int32_t *tokens, uint32_t len, uint8_t out[32])
{
    const void *parts[2] = { p->layout.fingerprint, tokens };
    size_t lens[2] = { CP_FINGERPRINT_BYTES, len * sizeof *tokens };
    cp_sha256(parts, lens, 2, out);
}

static uint64_t dedup_key(const uint8_t sha[32], cp_scope scope, uint32_t tenant)
{
    uint64_t k;
    memcpy(&k, sha, sizeof k);
    k ^= ((uint64_t)scope << 63) ^ (scope == CP_SCOPE_PRIVATE ? (uint64_t)tenant * 0x9e3779b97f4a7c15ull : 0);
    return k ? k : 1;
}

static pool_dedup *dedup_slot(const cp_pool *p, uint64_t key, const uint8_t sha[32], cp_scope scope, uint32_t tenant)
{
    size_t mask = p->dd_cap - 1;
    for (size_t i = key & mask;; i = (i + 1) & mask) {
        pool_dedup *d = &p->dd[i];
        if (d->key == 0) return d;
        if (d->key != key) continue;
        const cp_segment *s = p->segs[d->seg];
        if (memcmp(s->sha, sha, 32) == 0 && s->scope == scope && (scope == CP_SCOPE_SHARED || s->tenant == tenant)) return d;
    }
}

static void place_dedup(cp_pool *p, const void *entry)
{
    const pool_dedup *d = entry;
    const cp_segment *s = p->segs[d->seg];
    *dedup_slot(p, d->key, s->sha, s->scope, s->tenant) = *d;
}

static cp_status grow_dedup(cp_pool *p, cp_error *err)
{
    if ((p->dd_n + 1) * 2 <= p->dd_cap) return CP_OK;
    size_t cap = p->dd_cap ? p->dd_cap * 2 : 1024;
    pool_dedup *old = p->dd;
    size_t old_cap = p->dd_cap;
    p->dd = calloc(cap, sizeof *p->dd);
    if (!p->dd) {
        p->dd = old;
        return cp_fail(err, CP_ENOMEM, "pool: out of memory growing the dedup table");
    }
    p->dd_cap = cap;
    table_refill(p, old, old_cap, sizeof *old, place_dedup);
    free(old);
    return CP_OK;
}

static void dedup_remove(cp_pool *p, cp_segment *s)
{
    if (!s->live) return; /* purged: already out of the table */
    uint64_t key = dedup_key(s->sha, s->scope, s->tenant);
    pool_dedup *d = dedup_slot(p, key, s->sha, s->scope, s->tenant);
    if (d->key == 0 || d->seg != s->id) return;
    p->dd_n--;
    table_erase(p, p->dd, p->dd_cap, sizeof *d, (size_t)(d - p->dd), place_dedup);
}

/* ---- tenants ----------------------------------------------------------------- */

static size_t tenant_home(uint32_t id, size_t cap) { return id * 2654435761u & (cap - 1); }

pool_tenant *pool_tenant_find(cp_pool *p, uint32_t id, int create)
{
    size_t mask = p->ten_cap - 1;
    for (size_t j = tenant_home(id, p->ten_cap);; j = (j + 1) & mask) {
        pool_tenant *t = atomic_load_explicit(&p->ten[j], memory_order_acquire);
        if (!t) {
            if (!create) return NULL;
            /* reserve a place first: at most 3/4 of the slots are ever
             * taken, so every probe ends at an empty one */
            if (atomic_fetch_add(&p->ten_n, 1) >= p->ten_cap / 4 * 3) {
                atomic_fetch_sub(&p->ten_n, 1);
                return NULL;
            }
            pool_tenant *n = calloc(1, sizeof *n);
            if (!n) {
                atomic_fetch_sub(&p->ten_n, 1);
                return NULL;
            }
            n->id = id;
            n->win_start = pool_now(p);
            /* published whole: a reader sees the entry only after its fields */
            if (atomic_compare_exchange_strong_explicit(&p->ten[j], &t, n, memory_order_acq_rel, memory_order_acquire)) return n;
            free(n); /* another lookup took this slot first: t is its entry */
            atomic_fetch_sub(&p->ten_n, 1);
        }
        if (t->id == id) return t;
    }
}

/* Write lock: doubles the table (the entries stay where they are). */
static int tenant_grow(cp_pool *p)
{
    size_t cap = p->ten_cap * 2;
    _Atomic(pool_tenant *) *v = calloc(cap, sizeof *v);
    if (!v) return 0;
    for (size_t i = 0; i < p->ten_cap; i++) {
        pool_tenant *t = atomic_load_explicit(&p->ten[i], memory_order_relaxed);
        if (!t) continue;
        size_t j = tenant_home(t->id, cap);
        while (atomic_load_explicit(&v[j], memory_order_relaxed)) j = (j + 1) & (cap - 1);
        atomic_store_explicit(&v[j], t, memory_order_relaxed);
    }
    free((void *)p->ten);
    p->ten = v;
    p->ten_cap = cap;
    return 1;
}

pool_tenant *pool_tenant_get(cp_pool *p, uint32_t id)
{
    pool_tenant *t = pool_tenant_find(p, id, 0);
    if (t) return t;
    if ((atomic_load(&p->ten_n) + 1) * 2 > p->ten_cap && !tenant_grow(p)) return NULL;
    return pool_tenant_find(p, id, 1);
}

/* ---- segments ------------------------------------------------------------------ */

static void segment_destroy(cp_segment *s)
{
    if (!s) return;
    free(s->tokens);
    free(s->prefix);
    free(s->recompute);
    free(s->blocks);
    free(s);
}

typedef enum { WHY_LRU, WHY_GDSF, WHY_TTL, WHY_BUCKET, WHY_PURGE } evict_why;

/* Private KV may be a tenant's sensitive tokens: no trace of it is left in
 * a block that goes back to the slab, nor in a slab handed back to the
 * backend.  (On CUDA the zeroing is queued on the stream before any later
 * copy into the block, and cudaFree waits for the device.) */
static void zero_blocks(cp_pool *p, const cp_segment *s)
{
    for (uint32_t b = 0; b < s->n_blocks; b++) p->be->zero(p->be, cp_slab_block(&p->slab, s->blocks[b]), p->slab.block_bytes);
}

/* Never called on a pinned segment.  For the GDSF clock, a victim chosen by
 * priority has been settled first. */
static void evict(cp_pool *p, cp_segment *s, evict_why why)
{
    index_remove(p, s);
    dedup_remove(p, s);
    heap_remove(p, s);
    if (why != WHY_PURGE) { /* an erasure is no eviction: the GDSF clock does not age on it */
        if (why != WHY_TTL && p->o.policy == CP_EVICT_GDSF && s->priority > p->gdsf_clock) p->gdsf_clock = s->priority;
    }
    size_t bytes = seg_bytes(p, s);
    if (s->scope == CP_SCOPE_PRIVATE) zero_blocks(p, s); /* before the blocks are free to reuse */
    for (uint32_t b = 0; b < s->n_blocks; b++) cp_slab_release(&p->slab, s->blocks[b]);
    pool_tenant *t = pool_tenant_get(p, s->tenant);
    if (t) {
        t->bytes -= bytes;
        t->evictions++;
    }
    p->st.bytes_used -= bytes;
    p->st.tokens -= s->len;
    p->st.segments--;
    if (why == WHY_LRU) p->st.evictions_lru++;
    else if (why == WHY_GDSF) p->st.evictions_gdsf++;
    else if (why == WHY_TTL) p->st.evictions_ttl++;
    else if (why == WHY_BUCKET) p->st.evictions_bucket++;
    if (why == WHY_PURGE && t) t->evictions--; /* erased on request, not evicted */
    p->segs[s->id] = NULL;
    p->free_slots[p->n_free_slots++] = s->id;
    segment_destroy(s);
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
    int win = window_of(p, len);
    uint64_t key = pool_index_key(win, s->prefix[win]);
    uint8_t sha[32];
    segment_sha(p, s->tokens, len, sha);
    uint64_t dk = dedup_key(sha, s->scope, s->tenant);
    /* already stored (s's own dedup entry has the old hash: it does not match), or the insert itself */
    if (dedup_slot(p, dk, sha, s->scope, s->tenant)->key || same_identity(incoming, sha, s)) return 0;
    /* a new key moves it to another bucket (or a new one: the insert grew the index for it) */
    const pool_bucket *bk = key == s->key ? NULL : bucket_slot(p, key);
    uint32_t taken = bk && bk->key == key ? bk->n : 0;
    if (bk && taken + (key == incoming->key) >= (uint32_t)p->o.bucket_cap) return 0;
    /* the tail's blocks: zeroed (private) before the slab may hand them out */
    for (uint32_t b = nb; b < s->n_blocks; b++) {
        void *blk = cp_slab_block(&p->slab, s->blocks[b]);
        if (s->scope == CP_SCOPE_PRIVATE) p->be->zero(p->be, blk, p->slab.block_bytes);
        cp_slab_release(&p->slab, s->blocks[b]);
    }
    /* re-keyed as the shorter segment: dedup by its new hash, indexed by its new first window */
    dedup_remove(p, s);
    memcpy(s->sha, sha, sizeof sha);
    pool_dedup *d = dedup_slot(p, dk, s->sha, s->scope, s->tenant);
    d->key = dk;
    d->seg = s->id;
    p->dd_n++;
    if (key != s->key) {
        index_remove(p, s);
        s->key = key;
        index_add(p, s);
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
static int room_possible(const cp_pool *p, uint32_t need)
{
    uint32_t used = p->slab.n_blocks - p->slab.n_free;
    uint32_t evictable = used - atomic_load(&p->pinned_blocks);
    return need <= p->slab.n_free + evictable;
}

/* Evicts unpinned segments in policy order until `need` blocks are free,
 * the last one only by its tail when that is enough (truncate_tail): so
 * exactly `need` are free after it, not up to a victim's size more.
 * Called only after room_possible said yes, so it never stops half way
 * (an insert that cannot fit evicts nothing), and after grow_index made
 * room for the one key a truncation may add. */
static void make_room(cp_pool *p, uint32_t need, const cp_segment *incoming)
{
    size_t n_pinned = 0;
    while (p->slab.n_free < need && p->heap_n > 0) {
        cp_segment *s = p->segs[p->heap[0]];
        if (settle(p, s)) continue; /* hits raised it: look at the new top */
        if (atomic_load(&s->refcount) > 0) { /* pinned: set aside, never evicted */
            p->scratch[n_pinned++] = s->id;
            heap_remove(p, s);
            continue;
        }
        if (truncate_tail(p, s, need - p->slab.n_free, incoming)) break;
        evict(p, s, p->o.policy == CP_EVICT_LRU ? WHY_LRU : WHY_GDSF);
    }
    for (size_t i = 0; i < n_pinned; i++) { /* back into the heap */
        cp_segment *s = p->segs[p->scratch[i]];
        s->heap_pos = p->heap_n;
        p->heap[p->heap_n++] = s->id;
        heap_up(p, s->heap_pos);
    }
}

static size_t expire_locked(cp_pool *p, double now)
{
    if (p->o.ttl_s <= 0) return 0;
    size_t n = 0;
    for (uint32_t i = 0; i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (s && atomic_load(&s->refcount) == 0 && now - atomic_load(&s->last_used) > p->o.ttl_s) {
            evict(p, s, WHY_TTL);
            n++;
        }
    }
    p->last_expire = now;
    return n;
}

/* ---- erasure ------------------------------------------------------------------ */

/* Frees (zeroing) purged segments whose last pin is gone.  Write lock. */
static void reap_purged(cp_pool *p)
{
    for (uint32_t i = 0; i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (s && !s->live && atomic_load(&s->refcount) == 0) evict(p, s, WHY_PURGE);
    }
}

void pool_reap_purged(cp_pool *p)
{
    pthread_rwlock_wrlock(&p->lock);
    reap_purged(p);
    pthread_rwlock_unlock(&p->lock);
}

size_t cp_pool_purge(cp_pool *p, uint32_t tenant)
{
    pthread_rwlock_wrlock(&p->lock);
    size_t n = 0;
    for (uint32_t i = 0; i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (!s || !s->live || s->scope != CP_SCOPE_PRIVATE || s->tenant != tenant) continue;
        n++; /* pinned or not: gone for every lookup from now on */
        if (atomic_load(&s->refcount) == 0) {
            evict(p, s, WHY_PURGE);
            continue;
        }
        /* pinned by a request reading it: dead from now on (no lookup or
         * dedup finds it again), freed and zeroed when its last pin goes */
        index_remove(p, s);
        dedup_remove(p, s);
        s->live = 0;
    }
    p->st.purged += n;
    pthread_rwlock_unlock(&p->lock);
    return n;
}

size_t cp_pool_expire(cp_pool *p)
{
    pthread_rwlock_wrlock(&p->lock);
    size_t n = expire_locked(p, pool_now(p));
    pthread_rwlock_unlock(&p->lock);
    return n;
}

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

/* The unpinned member of a full bucket that gives way, or NULL. */
static cp_segment *bucket_victim(cp_pool *p, const pool_bucket *bk)
{
    cp_segment *victim = NULL;
    for (uint32_t i = 0; i < bk->n; i++) {
        cp_segment *c = p->segs[bk->ids[i]];
        if (atomic_load(&c->refcount) > 0) continue; /* in use by a request: never */
        if (!victim || effective_priority(c) < effective_priority(victim)) victim = c;
    }
    return victim;
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
        segment_destroy(s);
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
    segment_sha(p, s->tokens, s->len, s->sha);
    cp_rollhash_prefix(&p->rh, s->tokens, s->len, s->prefix);
    s->window = window_of(p, s->len);
    s->key = pool_index_key(s->window, s->prefix[s->window]);

    pthread_rwlock_wrlock(&p->lock);
    double now = pool_now(p);
    if (p->o.ttl_s > 0 && now - p->last_expire > 1.0) expire_locked(p, now);
    uint64_t dk = dedup_key(s->sha, s->scope, s->tenant);
    pool_tenant *t = pool_tenant_get(p, in->tenant);
    if (!t) {
        rc = cp_fail(err, CP_ENOMEM, "pool insert: out of memory for tenant statistics");
        goto out;
    }
    /* every table that may grow, grown before anything is evicted (the
     * index by two keys: this segment's and a truncated victim's) */
    if ((rc = grow_dedup(p, err)) || (rc = grow_index(p, 2, err)) || (rc = grow_segments(p, err))) goto out;
    pool_dedup *d = dedup_slot(p, dk, s->sha, s->scope, s->tenant);
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
    pool_bucket *bk = bucket_slot(p, s->key);
    cp_segment *victim = NULL; /* a full bucket gives up its least valuable unpinned member */
    if (bk->key == s->key && bk->n >= (uint32_t)p->o.bucket_cap && !(victim = bucket_victim(p, bk))) {
        p->st.insert_refusals++;
        t->insert_refusals++;
        rc = cp_fail(err, CP_ERANGE, "pool insert: its index bucket is full of pinned segments");
        goto out;
    }
    if (!room_possible(p, nb)) { /* the victim's blocks count: it is unpinned */
        p->st.insert_refusals++;
        t->insert_refusals++;
        rc = cp_fail(err, CP_ERANGE, "pool insert: %u blocks do not fit in the budget, even after eviction", nb);
        goto out;
    }
    if (victim) {
        settle(p, victim);
        evict(p, victim, WHY_BUCKET);
    }
    make_room(p, nb, s);
    for (uint32_t b = 0; b < nb; b++) cp_slab_alloc(&p->slab, &s->blocks[b]); /* make_room freed them */
    s->id = p->free_slots[--p->n_free_slots];
    if (s->id >= p->n_segs) p->n_segs = s->id + 1;
    p->segs[s->id] = s;
    s->live = 1;
    s->created = now;
    atomic_store(&s->last_used, now);
    s->priority = priority_of(p, s, 0, now);
    atomic_store(&s->touch_prio, s->priority);
    s->heap_pos = p->heap_n;
    p->heap[p->heap_n++] = s->id;
    heap_up(p, s->heap_pos);
    index_add(p, s); /* its bucket looked up again: evictions may have moved it */
    d = dedup_slot(p, dk, s->sha, s->scope, s->tenant);
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
    segment_destroy(s);
    if (rc == CP_OK && in->kv) rc = p->be->sync(p->be, err);
    return rc;
}

/* ---- lifetime ------------------------------------------------------------------- */

cp_status cp_pool_create(const cp_kv_layout *layout, cp_backend *be, const cp_pool_opts *opts, cp_pool **out, cp_error *err)
{
    *out = NULL;
    cp_status rc = cp_kv_layout_check(layout, err);
    if (rc) return rc;
    cp_pool *p = cp_calloc(1, sizeof *p, "pool", err);
    if (!p) return CP_ENOMEM;
    p->layout = *layout;
    p->be = be;
    if (opts) p->o = *opts;
    else cp_pool_opts_default(&p->o);
    if (p->o.n_windows < 1 || p->o.n_windows > CP_POOL_MAX_WINDOWS || p->o.bucket_cap < 1 ||
        p->o.bucket_cap > CP_POOL_BUCKET_CAP || p->o.max_request_tokens < 1)
        rc = cp_fail(err, CP_EINVAL, "pool: %d window sizes and a bucket cap of %d are not valid", p->o.n_windows, p->o.bucket_cap);
    for (int i = 0; rc == CP_OK && i < p->o.n_windows; i++)
        if (p->o.windows[i] < 1 || (i && p->o.windows[i] <= p->o.windows[i - 1]))
            rc = cp_fail(err, CP_EINVAL, "pool: window sizes must be positive and ascending");
    pthread_rwlock_init(&p->lock, NULL);
    if (rc == CP_OK && !(p->key_bits = calloc(POOL_KEY_BITS / 64, sizeof *p->key_bits)))
        rc = cp_fail(err, CP_ENOMEM, "pool: out of memory for the key filter");
    if (rc == CP_OK && !(p->ten = calloc(64, sizeof *p->ten))) rc = cp_fail(err, CP_ENOMEM, "pool: out of memory for the tenant table");
    if (rc == CP_OK) p->ten_cap = 64;
    if (rc == CP_OK) rc = cp_slab_init(&p->slab, be, cp_kv_block_bytes(layout), p->o.budget_bytes, err);
    if (rc == CP_OK) rc = cp_rollhash_init(&p->rh, p->o.hash_base, p->o.weak_hash_mod, err);
    if (rc == CP_OK) rc = cp_rollhash_reserve(&p->rh, p->o.max_request_tokens, err);
    if (rc == CP_OK) {
        p->st.bytes_budget = (size_t)p->slab.n_blocks * p->slab.block_bytes;
        p->last_expire = pool_now(p);
    }
    if (rc) {
        cp_pool_free(p);
        return rc;
    }
    *out = p;
    return CP_OK;
}

void cp_pool_free(cp_pool *p)
{
    if (!p) return;
    for (uint32_t i = 0; i < p->n_segs; i++) {
        cp_segment *s = p->segs[i];
        if (s && s->scope == CP_SCOPE_PRIVATE) zero_blocks(p, s); /* the slab goes back to the backend as it is */
        segment_destroy(s);
    }
    free(p->segs);
    free(p->free_slots);
    free(p->heap);
    free(p->scratch);
    free(p->idx);
    free(p->key_bits);
    free(p->dd);
    for (size_t i = 0; p->ten && i < p->ten_cap; i++) free(atomic_load(&p->ten[i]));
    free((void *)p->ten);
    if (p->slab.base) cp_slab_free_all(&p->slab);
    cp_rollhash_free(&p->rh);
    pthread_rwlock_destroy(&p->lock);
    free(p);
}

const cp_kv_layout *cp_pool_layout(const cp_pool *p) { return &p->layout; }

const cp_segment *cp_pool_segment(const cp_pool *p, const cp_matches *m, size_t i)
{
    if (!m || m->pool != p || !m->pinned || i >= m->n) return NULL;
    pthread_rwlock_rdlock((pthread_rwlock_t *)&p->lock);
    uint32_t id = m->v[i].seg;
    const cp_segment *s = id < p->n_segs ? p->segs[id] : NULL;
    if (s && atomic_load(&s->refcount) <= 0) s = NULL; /* not pinned: may go at any moment */
    if (s && s->scope != CP_SCOPE_SHARED && s->tenant != m->tenant) s = NULL; /* private: its owner only */
    pthread_rwlock_unlock((pthread_rwlock_t *)&p->lock);
    return s;
}

int cp_pool_pins(cp_pool *p, uint32_t id)
{
    pthread_rwlock_rdlock(&p->lock);
    int n = id < p->n_segs && p->segs[id] ? (int)atomic_load(&p->segs[id]->refcount) : -1;
    pthread_rwlock_unlock(&p->lock);
    return n;
}

void *cp_pool_kv_row(const cp_pool *p, const cp_segment *s, int layer, int kv, uint32_t t)
{
    uint32_t bt = (uint32_t)p->layout.block_tokens;
    return (char *)cp_slab_block(&p->slab, s->blocks[t / bt]) + cp_kv_block_offset(&p->layout, layer, kv, (int)(t % bt));
}

void cp_pool_stats_get(cp_pool *p, cp_pool_stats *out)
{
    pthread_rwlock_rdlock(&p->lock);
    *out = p->st;
    out->lookups = atomic_load(&p->ctr.lookups);
    out->hit_segments = atomic_load(&p->ctr.hit_segments);
    out->hit_tokens = atomic_load(&p->ctr.hit_tokens);
    out->missed_tokens = atomic_load(&p->ctr.missed_tokens);
    out->verify_failures = atomic_load(&p->ctr.verify_failures);
    out->filter_absent_probes = atomic_load(&p->ctr.filter_absent_probes);
    out->filter_false_positives = atomic_load(&p->ctr.filter_false_positives);
    out->pinned_blocks = atomic_load(&p->pinned_blocks);
    pthread_rwlock_unlock(&p->lock);
}

int cp_pool_tenant_stats(cp_pool *p, uint32_t tenant, cp_tenant_stats *out)
{
    pthread_rwlock_rdlock(&p->lock);
    const pool_tenant *t = pool_tenant_find(p, tenant, 0);
    if (t) {
        *out = (cp_tenant_stats){ .lookups = atomic_load(&t->lookups),
                                  .hit_segments = atomic_load(&t->hit_segments),
                                  .hit_tokens = atomic_load(&t->hit_tokens),
                                  .missed_tokens = atomic_load(&t->missed_tokens),
                                  .inserts = t->inserts,
                                  .insert_refusals = t->insert_refusals,
                                  .evictions = t->evictions,
                                  .privacy_refusals = t->privacy_refusals,
                                  .bytes = t->bytes };
    }
    pthread_rwlock_unlock(&p->lock);
    return t != NULL;
}

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
    segment_sha(p, s->tokens, s->len, sha);
    if (memcmp(sha, s->sha, 32) != 0) return cp_fail(err, CP_ERANGE, "segment %u: its hash is not that of its %u tokens", s->id, s->len);
    if (s->window != window_of(p, s->len) || s->key != pool_index_key(s->window, s->prefix[s->window]))
        return cp_fail(err, CP_ERANGE, "segment %u: window %d and key are not those of its %u tokens", s->id, s->window, s->len);
    const pool_dedup *d = dedup_slot(p, dedup_key(s->sha, s->scope, s->tenant), s->sha, s->scope, s->tenant);
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
        bytes += seg_bytes(p, s);
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
            if (heap_less(p, i, (i - 1) / 2)) rc = cp_fail(err, CP_ERANGE, "heap order broken at %zu", i);
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
