/* The pool's index (buckets by window key, and the key filter in front of
 * it) and its dedup table, both open-addressing tables; a segment's
 * identity (hash, window, keys). */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

uint64_t pool_index_key(int window, uint64_t hash)
{
    uint64_t k = hash * 0x9e3779b97f4a7c15ull ^ ((uint64_t)window << 56 | (uint64_t)window);
    return k ? k : 1; /* 0 marks an empty slot */
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

pool_bucket *pool_bucket_slot(const cp_pool *p, uint64_t key)
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
    const pool_bucket *b = pool_bucket_slot(p, key);
    return b->key == key ? b : NULL;
}

static void place_bucket(cp_pool *p, const void *entry)
{
    const pool_bucket *b = entry;
    *pool_bucket_slot(p, b->key) = *b;
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
cp_status pool_grow_index(cp_pool *p, size_t extra, cp_error *err)
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

void pool_index_remove(cp_pool *p, cp_segment *s)
{
    if (!s->window) return;
    pool_bucket *b = pool_bucket_slot(p, s->key);
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
 * (pool_grow_index) and checked the bucket is not full. */
void pool_index_add(cp_pool *p, cp_segment *s)
{
    pool_bucket *bk = pool_bucket_slot(p, s->key);
    if (bk->key == 0) {
        bk->key = s->key;
        bk->n = 0;
        p->idx_n++;
        key_bit_set(p, s->key);
    }
    bk->ids[bk->n++] = s->id;
}

/* The index window of a segment of len tokens: the largest that fits, 0 if none. */
int pool_window_of(const cp_pool *p, uint32_t len)
{
    int w = 0;
    for (int i = 0; i < p->o.n_windows; i++)
        if (p->o.windows[i] <= (int)len) w = p->o.windows[i];
    return w;
}

/* SHA-256(fingerprint || token ids): a segment's identity, for dedup and full matches. */
void pool_segment_sha(const cp_pool *p, const int32_t *tokens, uint32_t len, uint8_t out[32])
{
    const void *parts[2] = { p->layout.fingerprint, tokens };
    size_t lens[2] = { CP_FINGERPRINT_BYTES, len * sizeof *tokens };
    cp_sha256(parts, lens, 2, out);
}

uint64_t pool_dedup_key(const uint8_t sha[32], cp_scope scope, uint32_t tenant)
{
    uint64_t k;
    memcpy(&k, sha, sizeof k);
    k ^= ((uint64_t)scope << 63) ^ (scope == CP_SCOPE_PRIVATE ? (uint64_t)tenant * 0x9e3779b97f4a7c15ull : 0);
    return k ? k : 1;
}

pool_dedup *pool_dedup_slot(const cp_pool *p, uint64_t key, const uint8_t sha[32], cp_scope scope, uint32_t tenant)
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
    *pool_dedup_slot(p, d->key, s->sha, s->scope, s->tenant) = *d;
}

cp_status pool_grow_dedup(cp_pool *p, cp_error *err)
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

void pool_dedup_remove(cp_pool *p, cp_segment *s)
{
    if (!s->live) return; /* purged: already out of the table */
    uint64_t key = pool_dedup_key(s->sha, s->scope, s->tenant);
    pool_dedup *d = pool_dedup_slot(p, key, s->sha, s->scope, s->tenant);
    if (d->key == 0 || d->seg != s->id) return;
    p->dd_n--;
    table_erase(p, p->dd, p->dd_cap, sizeof *d, (size_t)(d - p->dd), place_dedup);
}
