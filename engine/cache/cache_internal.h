/* The cache manager's insides, shared by its files (cache.h is the API). */
#ifndef CP_CACHE_INTERNAL_H
#define CP_CACHE_INTERNAL_H

#include "admission.h"
#include "cache.h"
#include "reuse_rule.h"

struct cp_cache {
    cp_model *m;
    cp_pool *pool; /* NULL: sharing none */
    cp_tier *tier; /* NULL: the local pool only */
    cp_cache_opts o;
    cp_cache_policy pol;
    cp_admission adm;
};

struct cp_cache_hits {
    cp_matches priv, shared; /* the tenant's own, then shared ones */
};

struct cp_cache_writer {
    cp_cache *c;
    cp_cache_req r;
    const uint8_t *state, *exact, *shared_hit;
    uint8_t *held_shared; /* per token: held by the pool as shared (a shared hit, or stored shared here); NULL unless the policy stores segments */
    int segments, shared, private_;
};

/* The reuse rule's view of a request's prompt (reuse_rule.h). */
cp_rule_prompt cp_cache_rule_prompt(const cp_cache *c, const cp_cache_req *r);

#endif
