/* The reuse rule (see reuse_rule.h). */
#include "reuse_rule.h"

#include <string.h>

#include "../../kernels/sha256.h"
#include "../../pool/kv_layout.h"

void cp_rule_context_hash(const uint8_t *fingerprint, const int32_t *ids, int n, uint8_t out[32])
{
    static const char tag[] = "cacheprune context v1";
    const void *parts[3] = { tag, fingerprint, ids };
    size_t lens[3] = { sizeof tag, CP_FINGERPRINT_BYTES, (size_t)n * sizeof *ids };
    cp_sha256(parts, lens, 3, out);
}

/* template markup a request computes itself: no message's text, the same
 * for every tenant with these roles */
static int is_markup(const cp_rule_prompt *p, int t) { return p->msg[t] < 0 && !p->sensitive[t]; }

void cp_rule_exact(const cp_rule_prompt *p, const cp_rule_hit *h, size_t n, uint8_t *exact)
{
    memset(exact, 0, (size_t)p->T);
    int first_bos = p->bos >= 0 && p->T > 0 && p->ids[0] == p->bos;
    /* [0, up_shared): markup or exact shared hits, none sensitive (the chain a
     * shared segment may be proved over); [0, up_own): markup or exact hits of
     * either scope, none sensitive (a private segment's) */
    uint32_t up_shared = 0, up_own = 0, prev_end = 0;
    for (size_t i = 0; i < n; i++) {
        const cp_rule_hit *x = &h[i];
        /* the fresh tokens since the last hit: markup carries a chain that reached them */
        uint32_t g = prev_end;
        while (g < x->pos && is_markup(p, (int)g)) g++;
        if (up_shared == prev_end) up_shared = g;
        if (up_own == prev_end) up_own = g;
        prev_end = x->pos + x->len;
        if ((int32_t)x->pos != x->start_pos) continue; /* placed elsewhere: its KV saw another context */
        int ok = x->pos == 0 || (x->pos == 1 && first_bos);
        uint32_t chain = x->shared ? up_shared : up_own;
        if (!ok && x->pos == chain && x->context) {
            uint8_t ctx[32];
            cp_rule_context_hash(p->fingerprint, p->ids, (int)x->pos, ctx);
            ok = memcmp(ctx, x->context, sizeof ctx) == 0;
        }
        if (!ok) continue;
        memset(exact + x->pos, 1, x->len);
        int clean = 1;
        for (uint32_t t = 0; t < x->len; t++) clean &= !p->sensitive[x->pos + t];
        if (!clean) continue; /* a secret inside a hit ends every chain */
        if (up_own == x->pos) up_own = prev_end;
        if (x->shared && up_shared == x->pos) up_shared = prev_end;
    }
}

int cp_rule_may_vouch(const cp_rule_prompt *p, const uint8_t *kv_exact, const uint8_t *held_shared, const uint8_t *eligible, int start,
                      int len, int shared)
{
    for (int t = 0; t < start + len; t++)
        if (!kv_exact[t]) return 0;
    for (int t = 0; t < start; t++) {
        if (p->sensitive[t]) return 0;
        if (shared && (!eligible[t] || !(held_shared[t] || is_markup(p, t)))) return 0;
    }
    return 1;
}

void cp_rule_store_scopes(int want_shared, int admit_k, int admitted, int own_lookup, int *to_private, int *to_shared)
{
    *to_shared = want_shared && (admit_k <= 1 || admitted);
    *to_private = !*to_shared || (admit_k > 1 && own_lookup);
}

void cp_rule_tenant_counters(int report_reuse, cp_rule_counters *c)
{
    if (report_reuse) return;
    /* shared reuse shows as computation */
    c->computed += c->shared_reused;
    c->reused -= c->shared_reused;
    c->recomputed -= c->shared_recomputed; /* still counted in computed, as plain computation */
    c->shared_hit_tokens = c->shared_reused = c->shared_recomputed = 0;
    c->segments_hit = 0;
}
