/* Sharing modes as policies of the cache manager (cache.h): what each mode
 * looks up, which scopes it stores, whether the sensitive mask applies.  The
 * request path never branches on the mode; it asks the cache, which reads
 * one row of this table.
 *   none           no reuse
 *   tenant-prefix  exact prefix reuse within a tenant, 16-token blocks
 *   global-prefix  one prefix cache for everyone at token granularity
 *                  (the leaky baseline: it shares sensitive prefixes; it
 *                  exists only as the attack harness's control)
 *   chunk          fixed chunks from the start of each message, keyed by
 *                  content, reusable anywhere; a chunk holding a sensitive
 *                  token is not shared
 *   cacheprune     token-granular segments chosen by the annotator */
#ifndef CP_CACHE_POLICY_H
#define CP_CACHE_POLICY_H

#include "../../kernels/status.h"

typedef enum cp_sharing {
    CP_SHARE_NONE = 0,
    CP_SHARE_TENANT_PREFIX,
    CP_SHARE_GLOBAL_PREFIX,
    CP_SHARE_CHUNK,
    CP_SHARE_CACHEPRUNE,
} cp_sharing;

cp_status cp_sharing_from_name(const char *name, cp_sharing *out, cp_error *err);
const char *cp_sharing_name(cp_sharing s);

/* What a request stores of its whole prompt, after its first token. */
typedef enum cp_prompt_store {
    CP_PROMPT_STORE_NONE = 0,
    CP_PROMPT_STORE_PRIVATE_BLOCKS, /* its whole 16-token blocks from token 0, private */
    CP_PROMPT_STORE_SHARED,         /* all of it from token 0, shared (leaky: sensitive tokens too) */
    CP_PROMPT_STORE_PRIVATE,        /* all of it, private: the tenant's own later lookups */
    CP_PROMPT_STORE_CHUNKS,         /* fixed chunks from each message's start, shared, none with a sensitive token */
} cp_prompt_store;

typedef struct cp_cache_policy {
    cp_sharing sharing;
    int lookup_private;  /* the tenant's own private segments, looked up first */
    int private_prefix;  /* ... from token 0 only, cut to whole 16-token blocks */
    int lookup_shared;   /* shared segments */
    int shared_prefix;   /* ... from token 0 only */
    int shared_masked;   /* ... never over a sensitive token, nor over the tenant's own hits */
    int shared_whole;    /* ... whole segments only */
    cp_prompt_store prompt_store;
    int segments;        /* the annotator's segments of the request are stored (the engine exports attention) */
    int leaky;           /* shared inserts declare themselves leaky: the pool lets sensitive tokens through */
    int request_time;    /* a request-time recompute method may choose among its reused tokens (else the stored flags) */
    int chunk_ratio;     /* the recompute ratio R is --chunk-recompute (else the annotator's r) */
} cp_cache_policy;

/* The policy of a mode; private_reuse 0 turns off cacheprune's own-segment
 * lookup and its private whole-prompt store (tenant-prefix is private
 * reuse itself and keeps both). */
void cp_cache_policy_for(cp_sharing sharing, int private_reuse, cp_cache_policy *out);
/* Whether the policy reads or writes the pool at all. */
int cp_cache_policy_uses_pool(const cp_cache_policy *p);
/* Which lookups the shared tier serves: never the leaky baseline's (its
 * shared segments hold sensitive tokens).  1 when it serves any. */
int cp_cache_policy_tier(const cp_cache_policy *p, int *want_private, int *want_shared);

#endif
