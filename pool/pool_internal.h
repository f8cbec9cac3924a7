/* Internals shared by pool.c (store, index, eviction) and retrieve.c. */
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
    uint32_t *scratch; /* cap_segs ids: pinned segments make_room sets aside */
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
/* The tenant's entry.  create = 0: NULL if unknown.  Under the read lock a
 * new tenant is added by a compare-and-swap into an empty slot; NULL when
 * the table has no room until the next insert grows it, or out of memory. */
pool_tenant *pool_tenant_find(cp_pool *p, uint32_t id, int create);
/* Under the write lock: grows the table first.  NULL only when out of memory. */
pool_tenant *pool_tenant_get(cp_pool *p, uint32_t id);
/* A hit, under the read lock: hits, recency and the priority it earns, by atomics. */
void pool_touch(cp_pool *p, cp_segment *s, double now);
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
