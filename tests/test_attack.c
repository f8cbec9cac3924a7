/* Attack 1 with counters, not clocks: in cacheprune, none and
 * tenant-prefix the attacker's probes compute the same number of tokens and
 * hit the same segments for every candidate secret; in global-prefix the
 * true candidate's probe computes fewer (the harness sees a real leak). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/request.h"
#include "helpers.h"

static const char doc[] =
    "The lighthouse on the northern cape was built in 1868 from granite quarried on the island itself. Its keepers "
    "recorded the weather three times a day for ninety years, and their logbooks are now kept in the county archive, "
    "where historians use them to study the storms of the late nineteenth century. The keepers also noted passing "
    "ships, the state of the lamp, and the arrival of supplies by boat every second week in summer.";

static const char *const cards[] = { "4111 1111 1111 1111", "4012 8888 8888 1881", "4222 2222 2222 2222",
                                     "4000 0566 5566 5556", "4929 1234 5678 9018", "4716 4357 1020 1011" };

static void probe(cp_engine *e, uint32_t tenant, const char *card, cp_response *r)
{
    char q[256];
    snprintf(q, sizeof q, "Hello, my card is %s and I would like a short summary of the passage above, please.", card);
    cp_request_msg msgs[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 }, { CP_ROLE_USER, q, strlen(q), 0, NULL, 0 } };
    cp_request req = { .tenant = tenant, .msgs = msgs, .n_msgs = 2, .max_tokens = 1, .sampling = { .top_p = 1 } };
    cp_error err = { 0 };
    cr_assert_eq(cp_engine_run(e, &req, r, &err), CP_OK, "%s", err.msg);
}

/* computed_out (6, or NULL): each probe's computed tokens */
static void attack_mode_kv(cp_sharing mode, int expect_leak, cp_dtype kv, int *computed_out)
{
    char dir[512];
    cp_backend *be;
    cp_model *m = load_model_or_die(shared_path(dir, sizeof dir, "models/cp-books-6m"), &be);
    cp_tokenizer *tok = open_tokenizer_or_die("models/cp-books-6m");
    cp_error err = { 0 };
    cp_kv_layout l;
    cp_engine_kv_layout_as(m, kv, &l);
    cp_pool *pool = NULL;
    cr_assert_eq(cp_pool_create(&l, be, NULL, &pool, &err), CP_OK, "%s", err.msg);
    cp_detect_chain ch;
    cp_detector *d;
    cp_chain_init(&ch);
    cr_assert_eq(cp_detector_builtin(&d, &err), CP_OK);
    cr_assert_eq(cp_chain_add(&ch, d, &err), CP_OK);
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.sharing = mode;
    o.kv_dtype = kv;
    cp_engine *e;
    cr_assert_eq(cp_engine_create(m, tok, mode == CP_SHARE_NONE ? NULL : pool, &ch, &o, &e, &err), CP_OK, "%s", err.msg);
    cp_response r;
    probe(e, 1, cards[0], &r); /* the victim */
    cp_response_free(&r);
    int computed[6], hits[6], segs[6];
    for (int k = 0; k < 6; k++) { /* each probe from a fresh tenant */
        probe(e, 100 + (uint32_t)k, cards[k], &r);
        computed[k] = r.computed, hits[k] = r.shared_hit_tokens + r.private_hit_tokens, segs[k] = r.segments_hit;
        cp_response_free(&r);
    }
    for (int k = 1; k < 6; k++) {
        if (expect_leak) {
            cr_assert_lt(computed[0], computed[k], "%s: the true secret's probe should compute fewer tokens",
                         cp_sharing_name(mode));
        } else {
            cr_assert_eq(computed[k], computed[0], "%s: candidate %d computes %d tokens, the true one %d", cp_sharing_name(mode),
                         k, computed[k], computed[0]);
            cr_assert_eq(hits[k], hits[0], "%s: candidate %d hits differ", cp_sharing_name(mode), k);
            cr_assert_eq(segs[k], segs[0]);
        }
    }
    if (computed_out) memcpy(computed_out, computed, sizeof computed);
    cp_engine_free(e);
    cp_pool_free(pool);
    cp_chain_free(&ch);
    cp_tokenizer_free(tok);
    cp_model_free(m);
    cp_backend_destroy(be);
}

static void attack_mode(cp_sharing mode, int expect_leak) { attack_mode_kv(mode, expect_leak, CP_F32, NULL); }

/* --kv-dtype bf16 changes no verdict: cacheprune still shows every
 * candidate the same counters and global-prefix still leaks -- and each
 * probe computes exactly the tokens it computes with an f32 cache (what is
 * shared is decided before, and apart from, the KV's element type). */
Test(attack, bf16_kv_gives_the_same_verdicts, .timeout = TEST_TIMEOUT(120))
{
    static const cp_sharing modes[] = { CP_SHARE_CACHEPRUNE, CP_SHARE_GLOBAL_PREFIX };
    for (int i = 0; i < 2; i++) {
        int c32[6], c16[6];
        attack_mode_kv(modes[i], modes[i] == CP_SHARE_GLOBAL_PREFIX, CP_F32, c32);
        attack_mode_kv(modes[i], modes[i] == CP_SHARE_GLOBAL_PREFIX, CP_BF16, c16);
        for (int k = 0; k < 6; k++)
            cr_assert_eq(c16[k], c32[k], "%s: probe %d computes %d tokens with bf16 KV, %d with f32", cp_sharing_name(modes[i]), k, c16[k],
                         c32[k]);
    }
}

Test(attack, direct_probes_see_nothing_in_safe_modes, .timeout = TEST_TIMEOUT(120))
{
    attack_mode(CP_SHARE_CACHEPRUNE, 0);
    attack_mode(CP_SHARE_NONE, 0);
    attack_mode(CP_SHARE_TENANT_PREFIX, 0);
}

Test(attack, global_prefix_shows_the_leak, .timeout = TEST_TIMEOUT(60))
{
    attack_mode(CP_SHARE_GLOBAL_PREFIX, 1);
}
