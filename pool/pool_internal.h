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

typedef struct pool_tenant {
    uint32_t id;
    int used;
    cp_tenant_stats st;
    double win_start;
    size_t win_bytes;
    uint32_t win_segs;
} pool_tenant;

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
    double gdsf_clock;
    pool_bucket *idx; /* open addressing by key */
    size_t idx_cap, idx_n;
    /* one bit per key hash: most probes are for absent keys and end here,
     * in 2 MB that stay in cache, instead of in the bucket table */
    uint64_t *key_bits;
    pool_dedup *dd;
    size_t dd_cap, dd_n;
    pool_tenant *ten;
    size_t ten_cap, ten_n;
    double last_expire;
    cp_pool_stats st;
};

double pool_now(const cp_pool *p);
uint64_t pool_index_key(int window, uint64_t hash);
#define POOL_KEY_BITS (1u << 24)
static inline int pool_key_maybe(const cp_pool *p, uint64_t key)
{
    uint64_t b = (key >> 20) & (POOL_KEY_BITS - 1);
    return (int)(p->key_bits[b >> 6] >> (b & 63)) & 1;
}
/* NULL when absent */
const pool_bucket *pool_bucket_find(const cp_pool *p, uint64_t key);
pool_tenant *pool_tenant_get(cp_pool *p, uint32_t id); /* NULL only when out of memory */
void pool_touch(cp_pool *p, cp_segment *s); /* a hit: stats and eviction priority (write lock held) */

#endif
