/* The KV Pool: segments of KV (K stored before RoPE) in slab blocks, a
 * rolling-hash index over their first w tokens, eviction under a byte
 * budget (LRU or GreedyDual-Size-Frequency, plus a TTL), per-tenant insert
 * quotas, pins, statistics; and the Retriever (retrieve.c), which finds
 * stored segments inside a request in time linear in its length.
 *
 * Privacy, enforced here where the bytes are stored (not only upstream):
 * a shared insert must carry its per-token sensitive mask and is refused
 * (CP_EPERM, counted) if any token is sensitive; a private segment is
 * returned by lookups, and readable through cp_pool_segment, for its owner
 * only; private blocks are zeroed when evicted and when the pool is freed.
 *
 * Thread safety: every function may be called from several threads.
 * Lookups, releases, cp_pool_segment and the statistics share a read lock
 * and never take the write lock: pins, hit counts, recency and lookup
 * statistics are atomics, and a hit's new eviction priority is recorded in
 * the segment (touch_prio, an atomic max) and moved into the eviction heap
 * lazily, under the write lock, when the segment reaches the top of the
 * heap.  Inserts, evictions, expiry and cp_pool_check take the write lock;
 * while it is held no pin changes, so eviction decisions see exact pins. */
#ifndef CP_POOL_H
#define CP_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kv_layout.h"
#include "rollhash.h"
#include "slab.h"

typedef enum cp_scope { CP_SCOPE_PRIVATE = 0, CP_SCOPE_SHARED = 1 } cp_scope;
typedef enum cp_evict_policy { CP_EVICT_LRU = 0, CP_EVICT_GDSF = 1 } cp_evict_policy;

#define CP_POOL_MAX_WINDOWS 4
#define CP_POOL_BUCKET_CAP 16

typedef struct cp_pool_opts {
    size_t budget_bytes;          /* --pool-bytes */
    cp_evict_policy policy;
    double ttl_s;                 /* 0 = none: idle segments older than this are dropped */
    int windows[CP_POOL_MAX_WINDOWS]; /* index window sizes, ascending; default 16 32 64 128 */
    int n_windows;
    int bucket_cap;               /* <= CP_POOL_BUCKET_CAP */
    size_t max_request_tokens;    /* longest request a lookup accepts (default 1 << 20) */
    /* per tenant and per quota window */
    double quota_window_s;        /* default 60 */
    size_t quota_bytes;           /* 0 = unlimited */
    uint32_t quota_segments;      /* 0 = unlimited */
    uint64_t hash_base;           /* 0 = random per pool */
    uint64_t weak_hash_mod;       /* tests only: a small modulus to force collisions */
    /* 1: a victim of the budget always goes whole (the pool before tail-block
     * eviction; for measurements against it).  0 (default): a victim gives
     * up only the tail blocks an insert needs, see cp_pool_insert */
    int whole_eviction;
    double (*clock)(void *ctx);   /* seconds; NULL = CLOCK_MONOTONIC */
    void *clock_ctx;
} cp_pool_opts;

void cp_pool_opts_default(cp_pool_opts *o);

typedef struct cp_segment {
    uint32_t id;
    int live;                 /* 0: purged while pinned, freed when its pins go (write lock) */
    int32_t *tokens;
    uint32_t len;
    uint8_t sha[32];          /* SHA-256(fingerprint || token ids) */
    uint64_t *prefix;         /* rolling-hash prefixes of tokens, len + 1 */
    int32_t start_pos;        /* position its KV was computed at */
    /* SHA-256 of the tokens its creator had before it (positions [0, start_pos)),
     * set only when the creator vouched that its KV there was exact and free of
     * sensitive tokens (cp_insert.context); lets a request prove a segment's KV
     * exact when its own preceding tokens are the same (engine/request.c) */
    uint8_t context[32];
    int has_context;
    uint64_t *recompute;      /* bitset of tokens to recompute on reuse */
    uint32_t *blocks;
    uint32_t n_blocks;
    uint32_t tenant;          /* creator (private: owner) */
    cp_scope scope;
    double created;
    _Atomic double last_used; /* raised by lookups (atomic max) */
    _Atomic uint64_t hits;
    _Atomic int32_t refcount; /* pins */
    double priority;          /* eviction heap key (write lock): smallest goes first */
    _Atomic double touch_prio; /* the priority after the latest hit, >= priority; folded in lazily */
    size_t heap_pos;
    int window;               /* index window used, 0 = not indexed */
    uint64_t key;             /* index key (window, hash of the first `window` tokens) */
} cp_segment;

typedef struct cp_tenant_stats {
    uint64_t lookups, hit_segments, hit_tokens, missed_tokens;
    uint64_t inserts, insert_refusals, evictions;
    uint64_t privacy_refusals; /* shared inserts refused for a sensitive token or a missing mask */
    size_t bytes; /* live bytes of segments it created */
} cp_tenant_stats;

typedef struct cp_pool_stats {
    uint64_t lookups, hit_segments, hit_tokens, missed_tokens;
    uint64_t inserts, dedup_hits, insert_refusals, quota_refusals;
    uint64_t privacy_refusals;   /* shared inserts refused: a sensitive token, or no mask */
    uint64_t sensitive_shared;   /* shared segments stored over sensitive tokens (the leaky baseline only) */
    uint64_t evictions_lru, evictions_gdsf, evictions_ttl, evictions_bucket;
    /* victims that gave up only tail blocks (they stay, shorter), and those blocks */
    uint64_t truncations, truncated_blocks;
    uint64_t verify_failures;
    uint64_t purged;             /* private segments erased by cp_pool_purge */
    /* the key filter: index probes for keys with no bucket, and how many of
     * those the filter let through (its false positives) */
    uint64_t filter_absent_probes, filter_false_positives;
    size_t bytes_used, bytes_budget, segments;
    size_t tokens;               /* tokens the stored segments hold (their lengths' sum) */
    size_t pinned_blocks;
} cp_pool_stats;

typedef struct cp_pool cp_pool;

cp_status cp_pool_create(const cp_kv_layout *layout, cp_backend *be, const cp_pool_opts *opts, cp_pool **out, cp_error *err);
void cp_pool_free(cp_pool *p);
const cp_kv_layout *cp_pool_layout(const cp_pool *p);

/* Where the KV of a segment to insert comes from: for each layer, K (before
 * RoPE) and V rows of len tokens, `stride` elements apart, in backend memory
 * of the pool's dtype. */
typedef struct cp_kv_source {
    const void *const *k; /* [n_layers] */
    const void *const *v;
    size_t stride;        /* elements between consecutive tokens' rows */
} cp_kv_source;

typedef struct cp_insert {
    uint32_t tenant;
    cp_scope scope;
    const uint8_t *fingerprint; /* must equal the pool's */
    const int32_t *tokens;
    uint32_t len;
    int32_t start_pos;
    const uint8_t *recompute;   /* per token 0/1, or NULL */
    /* 32 bytes or NULL: the hash of the creator's tokens before the segment
     * (cp_segment.context); the first insert of a segment's tokens sets it,
     * a dedup hit leaves the stored one as it is */
    const uint8_t *context;
    /* per token 1 = sensitive.  Required for a shared insert (NULL is
     * refused); may be NULL for a private one. */
    const uint8_t *sensitive;
    /* 1 only for the global-prefix baseline, which exists to show the leak:
     * a shared segment may then hold sensitive tokens (counted in
     * stats.sensitive_shared).  The mask is still required. */
    int leaky_baseline;
    const cp_kv_source *kv;     /* NULL: blocks are left unwritten (tests, benchmarks) */
} cp_insert;

/* Stores a segment (or finds the identical one already there: *dedup = 1).
 *   CP_EPERM: a shared insert without a sensitive mask, or with a sensitive
 *     token (unless leaky_baseline); counted in privacy_refusals, nothing
 *     stored, not even as a dedup hit.
 *   CP_ERANGE: the tenant's quota, a bucket full of pinned segments, or the
 *     budget (counting everything unpinned as evictable) refuses it.  The
 *     decision is made before anything is evicted, so a refused insert
 *     leaves the stored segments as they were (only TTL expiry that was due
 *     anyway may run).  A refusal for room still counts toward the tenant's
 *     quota window (its bytes and one segment): trying is what costs, so a
 *     tenant cannot hammer a full pool for free.  A quota refusal itself,
 *     and a dedup hit, do not count.
 * Room is made in the eviction policy's order (pinned segments are skipped,
 * never changed).  The last victim gives up only as many of its tail blocks
 * as the insert still needs, when what is left is a segment the pool could
 * hold on its own (at least the smallest window); it stays, shorter: its
 * tokens, SHA-256, index key and dedup entry are those of its remaining
 * tokens, so it is found, deduplicated and verified exactly as a segment of
 * those tokens inserted alone would be, and never as the longer one (the KV
 * of a prefix does not depend on the tokens after it; its recompute flags
 * are the first tokens' flags, as a prefix hit reads them).  It goes whole
 * instead when its remaining tokens are already stored (in its scope and,
 * private, for its owner), or when its new index bucket is full.  Freed
 * private blocks are zeroed as on any eviction.
 * The returned id is not pinned. */
cp_status cp_pool_insert(cp_pool *p, const cp_insert *in, uint32_t *seg_id, int *dedup, cp_error *err);

/* A retrieved piece: request tokens [pos, pos + len) equal the first len
 * tokens of segment seg (len == the segment's length: a full match). */
typedef struct cp_match {
    uint32_t pos, len, seg;
} cp_match;

/* The result of a lookup, and the token for its pins: cp_pool_segment
 * reads a segment only through a cp_matches that still holds its pin. */
typedef struct cp_matches {
    cp_match *v;
    size_t n, cap;
    const cp_pool *pool; /* set by the lookup that pinned these */
    uint32_t tenant;     /* who looked them up */
    int pinned;          /* 1 from a successful lookup until cp_pool_release */
} cp_matches;

typedef struct cp_lookup {
    uint32_t tenant;
    const uint8_t *fingerprint;
    const int32_t *tokens;
    size_t n;
    const uint8_t *sensitive; /* per token; NULL = no restriction */
    int private_only;         /* 1: the tenant's private segments; 0: shared ones */
    int prefix_only;          /* only matches at request position 0 (prefix caches) */
    int whole_only;           /* only whole segments, no prefix hits (chunk caches) */
} cp_lookup;

/* Finds non-overlapping stored segments covering the most request tokens,
 * each verified (SHA-256 for a full match, token ids for a prefix hit), and
 * pins them: release with cp_pool_release.  Windows touching a sensitive
 * token are never probed and a match never extends over one.  Only the
 * tenant's own private segments (private_only) or shared ones are seen.
 * CP_EINVAL if out still holds pins (release them first: they would leak). */
cp_status cp_pool_lookup(cp_pool *p, const cp_lookup *q, cp_matches *out, cp_error *err);
/* Drops m's pins (once: a second call does nothing). */
void cp_pool_release(cp_pool *p, cp_matches *m);
void cp_matches_free(cp_matches *m);

/* The segment of match i of m, for the engine to read.  Lifetime: the
 * pointer (and every KV row reached through it) is valid only while m
 * holds its pins, i.e. until cp_pool_release(p, m); after that the segment
 * may be evicted and its blocks reused.  Enforced: NULL unless m comes from
 * a lookup in this pool that is not released yet, the segment is pinned,
 * and it is shared or owned by m's tenant. */
const cp_segment *cp_pool_segment(const cp_pool *p, const cp_matches *m, size_t i);
/* Pointer to token t's K (kv = 0) or V (kv = 1) row of a layer (backend
 * memory), of a segment from cp_pool_segment (same lifetime). */
void *cp_pool_kv_row(const cp_pool *p, const cp_segment *s, int layer, int kv, uint32_t t);

/* Erasure: removes every private segment tenant owns and returns how many.
 * Their blocks are zeroed before they go back to the slab.  Shared segments
 * (no owner) stay.  A segment pinned by a request at that moment is dead at
 * once (no lookup or dedup finds it again; still counted here) and is freed
 * and zeroed by the release that drops its last pin. */
size_t cp_pool_purge(cp_pool *p, uint32_t tenant);
/* Drops idle segments past the TTL; returns how many. */
size_t cp_pool_expire(cp_pool *p);
void cp_pool_stats_get(cp_pool *p, cp_pool_stats *out);
/* 0 if unknown.  A lookup by a tenant the pool has not seen adds it without
 * the write lock; while the tenant table is 3/4 full (until the next insert
 * grows it) such a lookup is counted in the pool's totals only. */
int cp_pool_tenant_stats(cp_pool *p, uint32_t tenant, cp_tenant_stats *out);
/* Invariant check for tests: blocks, bytes, refcounts and pinned blocks,
 * heap, index, the key filter's fill.  CP_OK or a message naming the first
 * broken invariant. */
cp_status cp_pool_check(cp_pool *p, cp_error *err);
/* For tests: the pins on segment id, or -1 when no segment has that id. */
int cp_pool_pins(cp_pool *p, uint32_t id);

#endif
