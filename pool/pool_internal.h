/* Internals shared by the pool's files: pool.c (lifetime, tenants,
 * statistics), pool_index.c (index, key filter, dedup), pool_evict.c (heap,
 * eviction, TTL), pool_insert.c, pool_purge.c, pool_check.c, and the
 * retriever (retrieve.c).  Functions marked "write lock" expect the caller
 * to hold p->lock for writing. */
#ifndef CP_POOL_INTERNAL_H
#define CP_POOL_INTERNAL_H

#include "pool.h"

typedef struct pool_bucket {
    uint64_t key; /* 0 = empty slot */
    uint32_t n;
    uint32_t ids[CP_POOL_BUCKET_CAP];
} pool_bucket;

typedef struct pool_dedup {
    uint64_t key; /* 0 = empty */
    uint32_t seg;
} pool_dedup;

/* One tenant, allocated once and never moved (the table holds pointers):
 * a lookup may hold one under the read lock while an insert grows the
 * table only under the write lock. */
typedef struct pool_tenant {
    uint32_t id;
    /* insert side: the write lock */
    uint64_t inserts, insert_refusals, privacy_refusals, evictions;
    size_t bytes;
    double win_start;
    size_t win_bytes;
    uint32_t win_segs;
    /* lookup side: atomics, under the read lock */
    _Atomic uint64_t lookups, hit_segments, hit_tokens, missed_tokens;
} pool_tenant;

/* what lookups count, under the read lock */
typedef struct pool_counters {
    _Atomic uint64_t lookups, hit_segments, hit_tokens, missed_tokens, verify_failures;
    _Atomic uint64_t filter_absent_probes, filter_false_positives;
} pool_counters;

struct cp_pool {
    cp_kv_layout layout;
    cp_backend *be;
    cp_pool_opts o;
    cp_slab slab;
    cp_rollhash rh;
    pthread_rwlock_t lock;
    cp_segment **segs; /* by id; NULL = free slot */
    uint32_t n_segs, cap_segs;
    uint32_t *free_slots;
    uint32_t n_free_slots;
    uint32_t *heap; /* eviction order: min priority at the top */
    size_t heap_n;
    uint32_t *scratch; /* cap_segs ids: pinned segments pool_make_room sets aside */
    /* blocks of pinned segments: changed by pins and releases (under the
     * read lock) on a segment's 0 <-> 1 transitions, so exact whenever the
     * write lock is held */
    _Atomic uint32_t pinned_blocks;
    double gdsf_clock;
    pool_bucket *idx; /* open addressing by key */
    size_t idx_cap, idx_n;
    /* one bit per key hash: most probes are for absent keys and end here,
     * in 2 MB that stay in cache, instead of in the bucket table */
    uint64_t *key_bits;
    /* keys removed from the index since the filter was last rebuilt: their
     * bits may still be set.  The filter is rebuilt from the live keys when
     * this passes both the live count and POOL_FILTER_REBUILD_MIN, so at
     * most idx_n + max(idx_n, POOL_FILTER_REBUILD_MIN) bits are ever set */
    size_t key_removals;
    pool_dedup *dd;
    size_t dd_cap, dd_n;
    _Atomic(pool_tenant *) *ten; /* open addressing by id; NULL = empty */
    size_t ten_cap;
    _Atomic size_t ten_n; /* slots taken or reserved */
    double last_expire;
    cp_pool_stats st;     /* the write-lock part of the statistics */
    pool_counters ctr;    /* the lookup part */
};

double pool_now(const cp_pool *p);
static inline size_t pool_seg_bytes(const cp_pool *p, const cp_segment *s) { return (size_t)s->n_blocks * p->slab.block_bytes; }

/* ---- pool.c: tenants, segments' memory ---- */
/* The tenant's entry.  create = 0: NULL if unknown.  Under the read lock a
 * new tenant is added by a compare-and-swap into an empty slot; NULL when
 * the table has no room until the next insert grows it, or out of memory. */
pool_tenant *pool_tenant_find(cp_pool *p, uint32_t id, int create);
/* Under the write lock: grows the table first.  NULL only when out of memory. */
pool_tenant *pool_tenant_get(cp_pool *p, uint32_t id);
void pool_segment_destroy(cp_segment *s);
/* Zeroes the segment's blocks (private KV leaves no trace in the slab). */
void pool_zero_blocks(cp_pool *p, const cp_segment *s);

/* ---- pool_index.c: the index and the dedup table (write lock, but
 * pool_bucket_find and pool_key_maybe, which lookups call under the read lock) ---- */
uint64_t pool_index_key(int window, uint64_t hash);
#define POOL_KEY_BITS (1u << 24)
/* a rebuild (a 2 MB memset and a pass over the index) at most once per this
 * many removals: well under 1 ns per removal; it bounds the stale bits to
 * 0.4 % of the filter */
#define POOL_FILTER_REBUILD_MIN 65536u
static inline int pool_key_maybe(const cp_pool *p, uint64_t key)
{
    uint64_t b = (key >> 20) & (POOL_KEY_BITS - 1);
    return (int)(p->key_bits[b >> 6] >> (b & 63)) & 1;
}
/* NULL when absent */
const pool_bucket *pool_bucket_find(const cp_pool *p, uint64_t key);
/* The bucket of key, or the empty slot where it would go. */
pool_bucket *pool_bucket_slot(const cp_pool *p, uint64_t key);
/* Room for `extra` more keys at a load of at most 1/2. */
cp_status pool_grow_index(cp_pool *p, size_t extra, cp_error *err);
/* Into the bucket of its key (made if new): the caller grew the index and
 * checked the bucket is not full. */
void pool_index_add(cp_pool *p, cp_segment *s);
void pool_index_remove(cp_pool *p, cp_segment *s);
/* The index window of a segment of len tokens: the largest that fits, 0 if none. */
int pool_window_of(const cp_pool *p, uint32_t len);
/* SHA-256(fingerprint || token ids): a segment's identity, for dedup and full matches. */
void pool_segment_sha(const cp_pool *p, const int32_t *tokens, uint32_t len, uint8_t out[32]);
uint64_t pool_dedup_key(const uint8_t sha[32], cp_scope scope, uint32_t tenant);
/* The entry of that identity, or the empty slot where it would go. */
pool_dedup *pool_dedup_slot(const cp_pool *p, uint64_t key, const uint8_t sha[32], cp_scope scope, uint32_t tenant);
cp_status pool_grow_dedup(cp_pool *p, cp_error *err);
void pool_dedup_remove(cp_pool *p, cp_segment *s);

/* ---- pool_evict.c: the heap and eviction (write lock, but pool_touch) ---- */
/* A hit, under the read lock: hits, recency and the priority it earns, by atomics. */
void pool_touch(cp_pool *p, cp_segment *s, double now);
typedef enum { POOL_WHY_LRU, POOL_WHY_GDSF, POOL_WHY_TTL, POOL_WHY_BUCKET, POOL_WHY_PURGE } pool_evict_why;
double pool_priority_of(const cp_pool *p, const cp_segment *s, uint64_t hits, double last_used);
int pool_heap_less(const cp_pool *p, size_t a, size_t b);
void pool_heap_up(cp_pool *p, size_t i);
/* Moves the priority hits earned into the heap key; 1 if it changed. */
int pool_settle(cp_pool *p, cp_segment *s);
/* Frees an unpinned segment: out of every table, blocks zeroed (private) and freed. */
void pool_evict(cp_pool *p, cp_segment *s, pool_evict_why why);
/* Can `need` blocks be had by evicting unpinned segments? */
int pool_room_possible(const cp_pool *p, uint32_t need);
/* Evicts in policy order until `need` blocks are free (after pool_room_possible said yes). */
void pool_make_room(cp_pool *p, uint32_t need, const cp_segment *incoming);
/* The unpinned member of a full bucket that gives way, or NULL. */
cp_segment *pool_bucket_victim(cp_pool *p, const pool_bucket *bk);
/* Evicts the idle unpinned segments past the TTL; how many. */
size_t pool_expire_locked(cp_pool *p, double now);

/* ---- pool_purge.c ---- */
/* Frees and zeroes the purged segments no pin holds any more (takes the write lock). */
void pool_reap_purged(cp_pool *p);

/* raises *a to v (atomic max) */
static inline void pool_atomic_max(_Atomic double *a, double v)
{
    double cur = atomic_load_explicit(a, memory_order_relaxed);
    while (cur < v && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed, memory_order_relaxed)) {
    }
}

#endif
