/* The cache manager (engine/cache/): the sharing modes' policy rows against
 * the table of docs/DESIGN.md ("Sharing modes"), the --admit-k table, the
 * refusals of cp_cache_create, and the rule that no file of the request
 * path reaches the pool or the tier but through the cache.  What the cache
 * does with a real pool is tested through the engine (test_request.c,
 * test_recompute.c chain_*, test_tier.c). */
#include <criterion/criterion.h>
#include <string.h>

#include "../engine/cache/admission.h"
#include "../engine/cache/cache.h"
#include "helpers.h"

/* one row per mode, written from the DESIGN.md table, not from policy.c */
typedef struct want_row {
    cp_sharing mode;
    int priv, priv_prefix, shared, shared_prefix, masked, whole;
    cp_prompt_store prompt;
    int segments, leaky, tier_private, tier_shared;
} want_row;

Test(cache, every_mode_is_the_policy_the_design_table_gives)
{
    const want_row rows[] = {
        { CP_SHARE_NONE, 0, 0, 0, 0, 0, 0, CP_PROMPT_STORE_NONE, 0, 0, 0, 0 },
        { CP_SHARE_TENANT_PREFIX, 1, 1, 0, 0, 0, 0, CP_PROMPT_STORE_PRIVATE_BLOCKS, 0, 0, 1, 0 },
        { CP_SHARE_GLOBAL_PREFIX, 0, 0, 1, 1, 0, 0, CP_PROMPT_STORE_SHARED, 0, 1, 0, 0 }, /* the leaky baseline: never on the tier */
        { CP_SHARE_CHUNK, 0, 0, 1, 0, 1, 1, CP_PROMPT_STORE_CHUNKS, 0, 0, 0, 1 },
        { CP_SHARE_CACHEPRUNE, 1, 0, 1, 0, 1, 0, CP_PROMPT_STORE_PRIVATE, 1, 0, 1, 1 },
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        const want_row *w = &rows[i];
        cp_cache_policy p;
        cp_cache_policy_for(w->mode, 1, &p);
        const char *n = cp_sharing_name(w->mode);
        cr_assert_eq(p.sharing, w->mode, "%s", n);
        cr_assert_eq(p.lookup_private, w->priv, "%s: private lookup", n);
        cr_assert_eq(p.private_prefix, w->priv_prefix, "%s: private prefix only", n);
        cr_assert_eq(p.lookup_shared, w->shared, "%s: shared lookup", n);
        cr_assert_eq(p.shared_prefix, w->shared_prefix, "%s: shared prefix only", n);
        cr_assert_eq(p.shared_masked, w->masked, "%s: the mask applies to the shared lookup", n);
        cr_assert_eq(p.shared_whole, w->whole, "%s: whole segments only", n);
        cr_assert_eq(p.prompt_store, w->prompt, "%s: what is stored of the prompt", n);
        cr_assert_eq(p.segments, w->segments, "%s: annotator segments", n);
        cr_assert_eq(p.leaky, w->leaky, "%s: leaky inserts", n);
        int tp, ts, any = cp_cache_policy_tier(&p, &tp, &ts);
        cr_assert(tp == w->tier_private && ts == w->tier_shared && any == (tp || ts), "%s: tier %d %d", n, tp, ts);
        cr_assert_eq(cp_cache_policy_uses_pool(&p), w->mode != CP_SHARE_NONE, "%s", n);
    }
    /* only a shared-prefix baseline without the mask is leaky: a masked or private lookup never is */
    for (int m = 0; m < 5; m++) {
        cp_cache_policy p;
        cp_cache_policy_for((cp_sharing)m, 1, &p);
        if (p.leaky) cr_assert(!p.shared_masked && !p.lookup_private, "%s", cp_sharing_name((cp_sharing)m));
    }
}

Test(cache, private_reuse_off_drops_only_cacheprune_s_own_segments)
{
    cp_cache_policy on, off;
    cp_cache_policy_for(CP_SHARE_CACHEPRUNE, 1, &on);
    cp_cache_policy_for(CP_SHARE_CACHEPRUNE, 0, &off);
    cr_assert(on.lookup_private && !off.lookup_private);
    cr_assert_eq(off.prompt_store, CP_PROMPT_STORE_NONE);
    cr_assert(off.lookup_shared && off.shared_masked && off.segments, "the shared side stays");
    cp_cache_policy_for(CP_SHARE_TENANT_PREFIX, 0, &off);
    cr_assert(off.lookup_private && off.prompt_store == CP_PROMPT_STORE_PRIVATE_BLOCKS, "tenant-prefix is private reuse itself");
}

Test(cache, admission_counts_distinct_tenants_and_forgets_one)
{
    cp_admission a = { .k = 3 };
    int32_t t[20], u[20];
    for (int i = 0; i < 20; i++) t[i] = 100 + i, u[i] = 200 + i;
    cr_assert_eq(cp_admission_record(&a, 7, t, 20), 0);
    cr_assert_eq(cp_admission_record(&a, 7, t, 20), 0, "one tenant twice is one producer");
    cr_assert_eq(cp_admission_record(&a, 8, t, 20), 0);
    cr_assert_eq(cp_admission_record(&a, 9, u, 20), 0, "another text counts apart");
    cr_assert_eq(cp_admission_record(&a, 9, t, 20), 1, "the third distinct tenant admits it");
    cr_assert_eq(cp_admission_forget(&a, 9), 2, "tenant 9 produced two texts");
    cr_assert_eq(cp_admission_record(&a, 7, t, 20), 0, "forgotten: two producers again");
    cr_assert_eq(cp_admission_forget(&a, 42), 0);
    cp_admission_free(&a);
    cp_admission one = { .k = 1 };
    cr_assert_eq(cp_admission_record(&one, 1, t, 20), 1, "k = 1 admits everything");
    cr_assert_null(one.v, "and records nothing");
}

Test(cache, create_refuses_what_it_cannot_serve)
{
    cp_model m;
    memset(&m, 0, sizeof m);
    cp_cache *c = NULL;
    cp_error err = { 0 };
    cp_cache_opts o = { .sharing = CP_SHARE_CHUNK, .admit_k = 1, .chunk_size = 512, .kv_dtype = CP_F32 };
    cr_assert_eq(cp_cache_create(&m, NULL, &o, &c, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "chunk") && strstr(err.msg, "pool"), "%s", err.msg);
    o.sharing = CP_SHARE_NONE, o.admit_k = 9;
    cr_assert_eq(cp_cache_create(&m, NULL, &o, &c, &err), CP_ERANGE);
    cr_assert(strstr(err.msg, "--admit-k 9"), "%s", err.msg);
    o.admit_k = 1, o.chunk_size = 15;
    cr_assert_eq(cp_cache_create(&m, NULL, &o, &c, &err), CP_ERANGE);
    o.chunk_size = 512;
    cr_assert_eq(cp_cache_create(&m, NULL, &o, &c, &err), CP_OK, "%s", err.msg);
    cr_assert(!cp_cache_active(c), "none without a pool reads and writes nothing");
    cp_cache_hits *h = NULL;
    cr_assert_eq(cp_cache_hits_create(&h, &err), CP_OK);
    cr_assert_eq(cp_cache_hit_tokens(h), 0);
    cp_cache_hits_free(c, h);
    size_t segs = 9, adm = 9;
    long tier = 9;
    cp_cache_purge_tenant(c, 3, &segs, &adm, &tier);
    cr_assert(segs == 0 && adm == 0 && tier == 0);
    cp_cache_free(c);
}

/* The request path's files name no pool or tier call, type or header: the
 * cache manager is their only door to stored KV. */
Test(cache, only_the_cache_reaches_the_pool, .timeout = TEST_TIMEOUT(30))
{
    if (test_sh("git rev-parse --is-inside-work-tree > /dev/null 2>&1") != 0) cr_skip("not a git checkout: nothing to scan");
    int rc = test_sh("git grep -n -E 'cp_pool_|cp_tier_|cp_matches|cp_segment\\b|pool/pool\\.h|pool/tier\\.h|CP_SHARE_(TENANT|GLOBAL|CHUNK)' -- "
                     "engine/request.c engine/request_store.c engine/prefill.c engine/pipeline.c engine/replay.c engine/engine.c "
                     "engine/engine_internal.h > /dev/null 2>&1");
    cr_assert_eq(rc, 1, "a file of the request path reaches the pool or branches on a sharing mode (git grep rc %d)", rc);
    /* the scan can fail: the pool's own sources do match it */
    cr_assert_eq(test_sh("git grep -q -E 'cp_pool_' -- engine/cache/cache_lookup.c"), 0);
}
