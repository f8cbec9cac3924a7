/* The reuse rule's decisions (engine/cache/reuse_rule.h) on hand-made prompts and
 * hits: no model, no pool.  The engine-level consequences are tested in
 * test_recompute.c (chain_*) and test_request.c (admission_*). */
#include <criterion/criterion.h>
#include <string.h>

#include "../engine/cache/reuse_rule.h"

enum { N = 64, BOS = 1 };

/* A prompt of N tokens: BOS, then message 0 over [1, 30), markup [30, 33),
 * message 1 over [33, N); no token sensitive unless a test marks one. */
typedef struct rprompt {
    int32_t ids[N], msg[N];
    uint8_t sens[N], fp[32];
    cp_rule_prompt p;
} rprompt;

static void rprompt_init(rprompt *r)
{
    memset(r, 0, sizeof *r);
    for (int t = 0; t < N; t++) {
        r->ids[t] = t == 0 ? BOS : 100 + t;
        r->msg[t] = t == 0 || (t >= 30 && t < 33) ? -1 : t < 30 ? 0 : 1;
    }
    memset(r->fp, 7, sizeof r->fp);
    r->p = (cp_rule_prompt){ .ids = r->ids, .T = N, .msg = r->msg, .sensitive = r->sens, .bos = BOS, .fingerprint = r->fp };
}

static int count(const uint8_t *v, int from, int to)
{
    int n = 0;
    for (int t = from; t < to; t++) n += v[t] != 0;
    return n;
}

/* The hit on message 1 ([33, N)) carries the hash of exactly this prompt's
 * tokens before it; what precedes it decides whether it may be proved. */
static int second_proved(rprompt *r, int first_shared, int second_shared, uint32_t first_len)
{
    uint8_t ctx[32], exact[N];
    cp_rule_context_hash(r->fp, r->ids, 33, ctx);
    cp_rule_hit h[2] = { { .pos = 1, .len = first_len, .start_pos = 1, .shared = first_shared, .context = NULL },
                         { .pos = 33, .len = N - 33, .start_pos = 33, .shared = second_shared, .context = ctx } };
    cp_rule_exact(&r->p, h, 2, exact);
    cr_assert_eq(count(exact, 1, 1 + (int)first_len), (int)first_len, "the hit after BOS is exact by its place");
    return count(exact, 33, N) == N - 33;
}

Test(reuse_rule, a_shared_segment_is_proved_only_over_shared_hits_and_markup)
{
    rprompt r;
    rprompt_init(&r);
    cr_assert(second_proved(&r, 1, 1, 29), "a chain of shared hits and markup did not prove the shared segment");
    /* the same tokens, but held only by the requester's own private segment: another tenant's
     * unstored text could sit there, and a proof would tell the requester whether it guessed it */
    cr_assert_not(second_proved(&r, 0, 1, 29), "a private hit was a link of a shared segment's chain");
    /* a private segment of the requester's own may be proved over its own private hit */
    cr_assert(second_proved(&r, 0, 0, 29), "a private segment was not proved over its owner's own chain");
    /* fresh message text between them ends every chain */
    cr_assert_not(second_proved(&r, 1, 1, 20), "a chain went on over fresh message text");
    cr_assert_not(second_proved(&r, 0, 0, 20), "a private chain went on over fresh message text");
}

Test(reuse_rule, a_secret_or_a_displaced_hit_ends_the_chain)
{
    rprompt r;
    rprompt_init(&r);
    r.sens[10] = 1;
    cr_assert_not(second_proved(&r, 1, 1, 29), "a chain went on past a sensitive token inside a hit");
    cr_assert_not(second_proved(&r, 0, 0, 29), "a private chain went on past a sensitive token inside a hit");
    rprompt_init(&r);
    r.sens[31] = 1; /* markup marked by the mask's padding is not markup any more */
    cr_assert_not(second_proved(&r, 1, 1, 29), "a chain went on over sensitive markup");
    /* a hit placed elsewhere than it was computed is not exact, nor anything after it */
    rprompt_init(&r);
    uint8_t ctx[32], exact[N];
    cp_rule_context_hash(r.fp, r.ids, 33, ctx);
    cp_rule_hit h[2] = { { .pos = 1, .len = 29, .start_pos = 5, .shared = 1 }, { .pos = 33, .len = N - 33, .start_pos = 33, .shared = 1, .context = ctx } };
    cp_rule_exact(&r.p, h, 2, exact);
    cr_assert_eq(count(exact, 0, N), 0, "a displaced hit, or one after it, was taken as exact");
    /* a wrong context hash proves nothing */
    ctx[0] ^= 1;
    h[0].start_pos = 1;
    cp_rule_exact(&r.p, h, 2, exact);
    cr_assert_eq(count(exact, 33, N), 0, "a segment whose creator had another context was proved");
}

Test(reuse_rule, a_shared_context_is_vouched_for_only_over_shared_text_and_markup)
{
    rprompt r;
    rprompt_init(&r);
    uint8_t kv[N], held[N], elig[N];
    memset(kv, 1, N), memset(held, 0, N), memset(elig, 1, N);
    memset(held, 1, 30); /* BOS and message 0 held as shared */
    cr_assert(cp_rule_may_vouch(&r.p, kv, held, elig, 33, N - 33, 1), "a prefix of shared text and markup was not vouched for");
    held[12] = 0; /* one token of message 0 held by no shared segment (a sentence too short to store) */
    cr_assert_not(cp_rule_may_vouch(&r.p, kv, held, elig, 33, N - 33, 1), "a shared context was vouched for over text the pool does not hold as shared");
    cr_assert(cp_rule_may_vouch(&r.p, kv, held, elig, 33, N - 33, 0), "a private segment's context over its owner's own text was refused");
    memset(held, 1, 30);
    elig[5] = 0;
    cr_assert_not(cp_rule_may_vouch(&r.p, kv, held, elig, 33, N - 33, 1), "a shared context was vouched for over text kept private");
    memset(elig, 1, N);
    r.sens[5] = 1;
    cr_assert_not(cp_rule_may_vouch(&r.p, kv, held, elig, 33, N - 33, 1), "a context holding a secret was vouched for (shared)");
    cr_assert_not(cp_rule_may_vouch(&r.p, kv, held, elig, 33, N - 33, 0), "a context holding a secret was vouched for (private)");
    r.sens[5] = 0;
    kv[40] = 0; /* stale KV inside the segment itself */
    cr_assert_not(cp_rule_may_vouch(&r.p, kv, held, elig, 33, N - 33, 1), "a segment over stale KV was vouched for");
}

Test(reuse_rule, under_admit_k_the_producer_keeps_its_own_copy)
{
    int p, s;
    cp_rule_store_scopes(1, 1, 0, 1, &p, &s);
    cr_assert(!p && s, "admit-k 1: shared only");
    cp_rule_store_scopes(0, 2, 1, 1, &p, &s);
    cr_assert(p && !s, "a segment that may not be shared is private only");
    cp_rule_store_scopes(1, 2, 0, 1, &p, &s);
    cr_assert(p && !s, "an unadmitted segment is the producer's own");
    cp_rule_store_scopes(1, 2, 1, 1, &p, &s);
    cr_assert(p && s, "an admitted segment is shared and still the producer's own: its view must not change with admission");
    cp_rule_store_scopes(1, 2, 1, 0, &p, &s);
    cr_assert(!p && s, "with no private lookup, no private copy");
}
