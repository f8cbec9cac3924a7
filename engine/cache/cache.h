/* The cache manager: the only door between a request and stored KV.
 *
 * Contract.  A request reads stored KV only through cp_cache_lookup and
 * cp_cache_place, and writes it only through a cp_cache_writer; nothing
 * above this layer includes the pool or the tier, or reads a segment.  The
 * cache owns every decision the information-flow rule of THREAT_MODEL.md
 * ("The rule") governs, so that rule is enforced here and nowhere else:
 *   - which stored segments a request sees: the sharing mode's policy
 *     (policy.h) over the request's sensitive mask, the tenant's private
 *     segments first, then shared ones over its non-sensitive tokens the
 *     private hits left uncovered; with a tier, its purge epoch first, then
 *     the tier's fill of uncovered windows (never one holding a sensitive
 *     token), then the local lookups again;
 *   - which hits' KV is proved exact (the chain proof, cp_rule_exact);
 *   - where a segment is stored: its scope (shared only when every token is
 *     shared-eligible), the --admit-k table of distinct producers
 *     (admission.h, cp_rule_store_scopes), whether it may carry its context
 *     hash (cp_rule_may_vouch), quotas (the pool's, and the tier's across
 *     replicas), the tier's write-through;
 *   - the erasure of a tenant (cp_cache_purge_tenant).
 * The engine decides only what it computes: which tokens to recompute among
 * the reused ones (engine/recompute.h), the annotator's choice of segments,
 * and whether a request stores at all (no-store, a client gone).
 *
 * Threads: one thread drives a cache (the engine's), except cp_cache_pool
 * and the policy, which are immutable. */
#ifndef CP_CACHE_H
#define CP_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "../../model/model.h"
#include "../../pool/pool.h"
#include "../../pool/tier.h"
#include "policy.h"

typedef struct cp_cache cp_cache;

typedef struct cp_cache_opts {
    cp_sharing sharing;
    int private_reuse;      /* cacheprune: the tenant's own segments are stored and looked up first */
    int admit_k;            /* a segment is shared once k distinct tenants produced it, [1, 8] */
    int chunk_size;         /* chunk: tokens per chunk (>= 16) */
    double chunk_recompute; /* chunk: the fraction of each chunk's head flagged for recompute */
    cp_dtype kv_dtype;      /* the request states' KV dtype: the pool must hold the same */
} cp_cache_opts;

/* pool NULL: only under sharing none.  m and pool are borrowed and must
 * outlive the cache; the pool's layout must be the model's (fingerprint)
 * in the KV dtype of the request states the cache places into. */
cp_status cp_cache_create(cp_model *m, cp_pool *pool, const cp_cache_opts *o, cp_cache **out, cp_error *err);
void cp_cache_free(cp_cache *c);
/* The shared segment tier under the local pool (pool/tier.h), or NULL;
 * borrowed, it must outlive the cache.  Set before the first lookup. */
void cp_cache_set_tier(cp_cache *c, cp_tier *t);
cp_pool *cp_cache_pool(const cp_cache *c);
const cp_cache_policy *cp_cache_policy_of(const cp_cache *c);
/* Whether the cache reads or writes anything for a request (a pool, and a
 * mode that shares). */
int cp_cache_active(const cp_cache *c);
/* Whether a tier is set under the pool. */
int cp_cache_tiered(const cp_cache *c);

/* The pool layout that holds this model's KV as the engine stores it (16
 * tokens a block, the model's fingerprint) in a KV dtype. */
void cp_cache_kv_layout(const cp_model *m, cp_dtype kv_dtype, cp_kv_layout *out);

/* One request as the cache sees it: every array has T entries and outlives
 * the calls it is passed to. */
typedef struct cp_cache_req {
    uint32_t tenant;
    const int32_t *ids;
    int T;
    const int32_t *msg;       /* per token: its message, < 0 for template markup */
    const uint8_t *sensitive; /* the sensitive mask */
    const uint8_t *eligible;  /* shared-eligible (system, document, template, user unless private) */
    int bos;                  /* the tokenizer's BOS id, < 0 for none */
} cp_cache_req;

/* Per-token codes of a request's plan (cp_response's plan). */
enum { CP_CACHE_FRESH = 0, CP_CACHE_REUSED = 1, CP_CACHE_RECOMPUTE = 2 };

/* A request's hits and the pins on them, from its lookup until released. */
typedef struct cp_cache_hits cp_cache_hits;
cp_status cp_cache_hits_create(cp_cache_hits **out, cp_error *err);
/* Releases its pins (c may be NULL when it holds none) and frees it. */
void cp_cache_hits_free(cp_cache *c, cp_cache_hits *h);
/* Releases the pins: the hits are empty again. */
void cp_cache_release(cp_cache *c, cp_cache_hits *h);
/* Prompt tokens the hits cover. */
int cp_cache_hit_tokens(const cp_cache_hits *h);

/* Where a lookup's time goes: mark(ctx, what) ends a stretch of it. */
enum { CP_CACHE_MARK_TIER, CP_CACHE_MARK_LOOKUP };
typedef void (*cp_cache_mark_fn)(void *ctx, int what);

/* The request's hits under the policy (pins taken, every match verified).
 * h must be empty (new or released). */
cp_status cp_cache_lookup(cp_cache *c, const cp_cache_req *r, cp_cache_hits *h, cp_cache_mark_fn mark, void *mark_ctx, cp_error *err);

/* What placement tells the request, per token (arrays of T, zeroed by the
 * caller): state CP_CACHE_REUSED or CP_CACHE_RECOMPUTE (the segment's stored
 * flag) over every hit, shared_hit where a shared segment's KV came,
 * seg_off its offset in its segment (capped at 255), exact where the chain
 * proof shows the reused KV equal to this context's own. */
typedef struct cp_cache_plan {
    uint8_t *state, *shared_hit, *seg_off, *exact;
    int segments_hit, private_hit_tokens, shared_hit_tokens;
} cp_cache_plan;

/* Copies every hit's KV into st (16-token blocks, K rotated to the
 * request's positions: slot = position = token index) and fills *p. */
cp_status cp_cache_place(cp_cache *c, const cp_cache_req *r, const cp_cache_hits *h, cp_state *st, cp_cache_plan *p, cp_error *err);

/* One request's stores, after its first token: what it holds shared of its
 * prompt as they go in order (for the context hashes) and its counts. */
typedef struct cp_cache_writer cp_cache_writer;
/* state, exact and shared_hit: the request's plan (cp_cache_plan's). */
cp_status cp_cache_writer_open(cp_cache *c, const cp_cache_req *r, const uint8_t *state, const uint8_t *exact, const uint8_t *shared_hit,
                               cp_cache_writer **out, cp_error *err);
/* The policy's store of the request's prompt (its KV in st): blocks,
 * prefix, chunks or the tenant's private copy.  A refusal by the pool
 * (budget, quota, too short) is not an error: the request is still served. */
cp_status cp_cache_store_prompt(cp_cache_writer *w, cp_state *st, cp_error *err);
/* One annotator segment of a computed sequence whose position p is request
 * token p + off: tokens[start, start + len) with its KV in st at the same
 * rows and its recompute flags.  Its scope is shared when every token is
 * shared-eligible, else private; own_kv: st is the request's own KV
 * computed over its prompt (off 0), so the segment may carry its context
 * hash where the rule lets it. */
cp_status cp_cache_store_segment(cp_cache_writer *w, cp_state *st, const int32_t *tokens, int start, int len, const uint8_t *recompute,
                                 int off, int own_kv, cp_error *err);
/* Segments stored (by scope) and the writer freed. */
void cp_cache_writer_close(cp_cache_writer *w, int *segments, int *shared, int *private_);

/* Erasure of one tenant: its private segments purged from the pool
 * (*segments), it dropped from every --admit-k record (*admissions); with a
 * tier, its private values there (*tier_segments; -1 when Redis could not
 * be reached; 0 without a tier; may be NULL) and its purge epoch moved. */
void cp_cache_purge_tenant(cp_cache *c, uint32_t tenant, size_t *segments, size_t *admissions, long *tier_segments);

#endif
