/* The sharing modes' policies (see policy.h). */
#include "policy.h"

#include <string.h>

static const char *const sharing_names[] = { "none", "tenant-prefix", "global-prefix", "chunk", "cacheprune" };

cp_status cp_sharing_from_name(const char *name, cp_sharing *out, cp_error *err)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(name, sharing_names[i]) == 0) return *out = (cp_sharing)i, CP_OK;
    return cp_fail(err, CP_EINVAL, "unknown sharing mode '%.32s' (none, tenant-prefix, global-prefix, chunk, cacheprune)", name);
}
const char *cp_sharing_name(cp_sharing s) { return (unsigned)s < 5 ? sharing_names[s] : "?"; }

/* one row per mode, in cp_sharing's order */
static const cp_cache_policy policies[] = {
    [CP_SHARE_NONE] = { .sharing = CP_SHARE_NONE },
    [CP_SHARE_TENANT_PREFIX] = { .sharing = CP_SHARE_TENANT_PREFIX, .lookup_private = 1, .private_prefix = 1,
                                 .prompt_store = CP_PROMPT_STORE_PRIVATE_BLOCKS },
    [CP_SHARE_GLOBAL_PREFIX] = { .sharing = CP_SHARE_GLOBAL_PREFIX, .lookup_shared = 1, .shared_prefix = 1,
                                 .prompt_store = CP_PROMPT_STORE_SHARED, .leaky = 1 },
    [CP_SHARE_CHUNK] = { .sharing = CP_SHARE_CHUNK, .lookup_shared = 1, .shared_masked = 1, .shared_whole = 1, .prompt_store = CP_PROMPT_STORE_CHUNKS,
                         .chunk_ratio = 1 },
    [CP_SHARE_CACHEPRUNE] = { .sharing = CP_SHARE_CACHEPRUNE, .lookup_private = 1, .lookup_shared = 1, .shared_masked = 1,
                              .prompt_store = CP_PROMPT_STORE_PRIVATE, .segments = 1, .request_time = 1 },
};

void cp_cache_policy_for(cp_sharing sharing, int private_reuse, cp_cache_policy *out)
{
    *out = policies[(unsigned)sharing < 5 ? sharing : CP_SHARE_NONE];
    if (sharing == CP_SHARE_CACHEPRUNE && !private_reuse) { /* --private-reuse off: nothing of the tenant's own */
        out->lookup_private = 0;
        out->prompt_store = CP_PROMPT_STORE_NONE;
    }
}

int cp_cache_policy_uses_pool(const cp_cache_policy *p)
{
    return p->lookup_private || p->lookup_shared || p->prompt_store != CP_PROMPT_STORE_NONE || p->segments;
}

int cp_cache_policy_tier(const cp_cache_policy *p, int *want_private, int *want_shared)
{
    *want_private = p->lookup_private;
    *want_shared = p->lookup_shared && !p->leaky;
    return *want_private || *want_shared;
}
