/* The reuse rule (THREAT_MODEL.md, "The rule"), in one place:
 *
 *   what a request's cost, counters, timing, scheduling and output may
 *   depend on is the content of shared segments and the positions of its
 *   own hits — never another tenant's text that the pool does not hold as
 *   shared, and never the admission state of segments.
 *
 * The decisions that could break it are here, as pure functions of their
 * arguments (no engine, pool or request state); the cache manager
 * (cache.h) is the only caller of the first three, the one door between a
 * request and stored KV:
 *   cp_rule_exact         which hits' KV is proved exact (the chain proof):
 *                         exact tokens are never recomputed, so this decides
 *                         a request's cost
 *   cp_rule_may_vouch     whether an insert may carry its context hash (what
 *                         a later proof compares)
 *   cp_rule_store_scopes  where a segment is stored under --admit-k, so that
 *                         a producer's own view never shows its admission
 *   cp_rule_tenant_counters  the counters a tenant is told (the engine's
 *                         cp_response_tenant_view applies it)
 * The other inputs of a request's cost keep their own promises where they
 * run: the lookup (the cache manager's, cache_lookup.c: the tenant's
 * private segments first, then shared ones over its non-sensitive tokens)
 * and the recompute count (engine/recompute.h: a function of the hit
 * positions and the exact tokens). */
#ifndef CP_REUSE_RULE_H
#define CP_REUSE_RULE_H

#include <stddef.h>
#include <stdint.h>

/* One request's prompt as the rule sees it. */
typedef struct cp_rule_prompt {
    const int32_t *ids;
    int T;
    const int32_t *msg;          /* per token: its message, < 0 for the template's markup (BOS, role tags) */
    const uint8_t *sensitive;    /* per token: the request's sensitive mask */
    int bos;                     /* the BOS id, < 0 for none */
    const uint8_t *fingerprint;  /* the model's (CP_FINGERPRINT_BYTES), part of every context hash */
} cp_rule_prompt;

/* One hit: request tokens [pos, pos + len) are the first len tokens of a
 * stored segment. */
typedef struct cp_rule_hit {
    uint32_t pos, len;
    int32_t start_pos;          /* the position the segment's KV was computed at */
    int shared;                 /* a shared segment; 0: the requester's own private one */
    const uint8_t *context;     /* the context hash its creator vouched for (32 bytes), or NULL */
} cp_rule_hit;

/* The hash a chain proof compares: SHA-256 of a tag, the fingerprint and
 * ids[0, n) (a segment's context: every token before it). */
void cp_rule_context_hash(const uint8_t *fingerprint, const int32_t *ids, int n, uint8_t out[32]);

/* Which reused tokens have exact KV (what a plain prefill of this prompt
 * computes), into exact[T] (zeroed first); h: the request's hits, sorted by
 * pos, not overlapping.  A hit is exact when it sits where its KV was
 * computed and either nothing but BOS precedes it, or its creator's context
 * hash equals this prompt's tokens before it and those tokens form an
 * unbroken chain, each token a non-sensitive exact hit or template markup
 * computed here.  Which hits may be links of that chain depends on what is
 * proved:
 *   a shared segment  only shared hits and markup: what any tenant could
 *                     send and probe.  A private hit (the requester's own
 *                     earlier prompt, holding text the pool does not hold as
 *                     shared) or fresh text ends the chain for every shared
 *                     segment after it — else a tenant could vouch for
 *                     another's unstored sentence by sending a guess of it
 *                     first, and read the guess's truth from its own cost.
 *   a private one     the requester's own and shared hits and markup: the
 *                     hash was vouched for by the requester itself, over
 *                     its own earlier prompt, so the comparison tells it
 *                     only about its own text.
 * What the outcome depends on is thus the hit positions and whether a
 * shared-held prefix equals the one its segment was first stored after —
 * never a sensitive token, never text the pool holds only privately. */
void cp_rule_exact(const cp_rule_prompt *p, const cp_rule_hit *h, size_t n, uint8_t *exact);

/* Whether a segment [start, start + len) a request stores may carry its
 * context hash.  kv_exact[t]: token t's KV here is exact (fresh over an
 * exact prefix, or an exact hit); held_shared[t]: token t is held by the
 * pool as shared (a shared hit, or in a shared segment this request stored
 * before this one); eligible[t]: t may be shared at all (no --user-text
 * private text, no assistant turn).  Every token up to the segment's end
 * must be exact and none before it sensitive; before a shared segment every
 * token must also be eligible and either held as shared or markup — so a
 * shared segment's hash is never computed over text the pool holds only
 * privately (a short sentence never stored, a private hit), and a proof
 * never compares one.  Under --admit-k the caller also requires k tenants
 * to have produced the prefix (request.c: admission is engine state). */
int cp_rule_may_vouch(const cp_rule_prompt *p, const uint8_t *kv_exact, const uint8_t *held_shared, const uint8_t *eligible, int start,
                      int len, int shared);

/* Where a segment a request stores goes.  want_shared: it may be shared
 * (every token eligible); admitted: --admit-k's record says k distinct
 * tenants produced it (ignored when admit_k <= 1); own_lookup: the engine
 * looks up a tenant's private segments (cacheprune with private reuse).
 * Without admission (admit_k <= 1) a shared-eligible segment is stored
 * shared only.  Under --admit-k, where own segments are looked up, its
 * producer always keeps a private copy, admitted or not, and it is stored
 * shared too once admitted: the producer's later requests hit that private
 * copy either way, so what it is told and pays for them is the same before
 * and after its text became shared (else its own counters would show
 * whether another tenant had sent the same text).  Where own segments are
 * not looked up (the chunk baseline) an unadmitted segment is stored
 * private, as nobody reads it, and that promise is not made. */
void cp_rule_store_scopes(int want_shared, int admit_k, int admitted, int own_lookup, int *to_private, int *to_shared);

/* A response's reuse counters, as cp_rule_tenant_counters reads and
 * rewrites them. */
typedef struct cp_rule_counters {
    int computed, reused, recomputed;
    int segments_hit, shared_hit_tokens, shared_reused, shared_recomputed;
} cp_rule_counters;

/* Without --report-reuse (report_reuse 0) a tenant is not told that
 * another's shared segment served it: shared hits count as computation
 * (reused or recomputed), so computed + reused stays the prompt length and
 * the shared counters read 0.  With it, unchanged. */
void cp_rule_tenant_counters(int report_reuse, cp_rule_counters *c);

#endif
