/* Request-time recompute methods (recompute.h). */
#include "recompute.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../model/forward_select.h"

static const char *const method_names[] = { "attention", "deviation", "gradual", "flagged", "epic" };

cp_status cp_recompute_from_name(const char *name, cp_recompute_method *out, int *deviation, cp_error *err)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(name, method_names[i]) == 0) {
            *deviation = i == 1;
            *out = i < 2 ? CP_RECOMPUTE_PLAN : (cp_recompute_method)(i - 1); /* attention / deviation: the plan path */
            return CP_OK;
        }
    return cp_fail(err, CP_EINVAL, "unknown recompute method '%.32s' (attention, deviation, gradual, flagged, epic)", name);
}

const char *cp_recompute_name(cp_recompute_method m, int deviation)
{
    if (m == CP_RECOMPUTE_PLAN) return method_names[deviation ? 1 : 0];
    return (unsigned)m <= CP_RECOMPUTE_EPIC ? method_names[m + 1] : "?";
}

enum { FRESH = 0, REUSED = 1, RECOMPUTE = 2 };

/* the per-layer schedule of ranked tokens kept: all of them below the
 * deviation layer, then from start x R down to R of the reused tokens
 * (less the forced ones among them), linearly, ending at exactly k_end */
static void schedule(const cp_recompute_opts *o, int L, int n_ranked, int n_reused, int forced_reused, int k_end, int *keep)
{
    double r0 = o->method == CP_RECOMPUTE_GRADUAL ? o->r * o->start : o->r;
    if (r0 > 1) r0 = 1;
    for (int l = 0; l < L; l++) {
        if (l < o->layer) {
            keep[l] = n_ranked;
            continue;
        }
        double f = l == L - 1 ? o->r : r0 + (o->r - r0) * (double)(l - o->layer) / (double)(L - 1 - o->layer);
        long k = (long)ceil(f * n_reused) - forced_reused;
        if (l == L - 1 || k < k_end) k = k_end;
        if (k > keep[l - 1]) k = keep[l - 1];
        keep[l] = (int)k;
    }
}

static cp_status check_opts(const cp_recompute_opts *o, int L, cp_error *err)
{
    if (o->method < CP_RECOMPUTE_GRADUAL || o->method > CP_RECOMPUTE_EPIC)
        return cp_fail(err, CP_EINVAL, "recompute: method %d is not a request-time method", (int)o->method);
    if (!(o->r >= 0 && o->r <= 1)) return cp_fail(err, CP_ERANGE, "recompute: R %g is outside [0, 1]", o->r);
    if (!(o->start >= 1 && o->start <= 100)) return cp_fail(err, CP_ERANGE, "recompute: the gradual start %g is outside [1, 100]", o->start);
    if (o->layer < 1 || o->layer >= L)
        return cp_fail(err, CP_ERANGE, "recompute: deviation layer %d is outside [1, %d) of this model", o->layer, L);
    if (o->k_first < 0) return cp_fail(err, CP_ERANGE, "recompute: %d first tokens", o->k_first);
    if (o->tail < 0) return cp_fail(err, CP_ERANGE, "recompute: a tail of %d tokens", o->tail);
    if (!(o->per_segment >= 0 && o->per_segment <= 1))
        return cp_fail(err, CP_ERANGE, "recompute: R per segment %g is outside [0, 1]", o->per_segment);
    return CP_OK;
}

typedef struct plan {
    int32_t *tok, *slot;
    uint8_t *fixed, *depth;
    int *keep;
    int n;
} plan;

static void plan_free(plan *p) { free(p->tok), free(p->slot), free(p->fixed), free(p->depth), free(p->keep); }

cp_status cp_recompute_prefill(cp_model *m, cp_state *st, const cp_recompute_opts *o, const cp_recompute_in *in, uint8_t *state,
                               float *logits, cp_recompute_stats *stats, cp_error *err)
{
    const int L = m->cfg.n_layers, T = in->T;
    memset(stats, 0, sizeof *stats);
    cp_status rc = check_opts(o, L, err);
    if (rc) return rc;
    if (T < 1) return cp_fail(err, CP_EINVAL, "recompute: an empty prompt");
    plan p = { 0 };
    p.tok = malloc((size_t)T * sizeof *p.tok), p.slot = malloc((size_t)T * sizeof *p.slot);
    p.fixed = malloc((size_t)T), p.depth = malloc((size_t)T), p.keep = malloc((size_t)L * sizeof *p.keep);
    uint8_t *role = malloc((size_t)T); /* 0 not computed, 1 fixed, 2 ranked */
    if (!p.tok || !p.slot || !p.fixed || !p.depth || !p.keep || !role) {
        plan_free(&p), free(role);
        return cp_fail(err, CP_ENOMEM, "recompute: out of memory for %d tokens", T);
    }
    int n_u = 0, forced_u = 0, n_ranked = 0, n_seg = 0;
    /* the tail: from the end, the first `tail` reused tokens that are not exact
     * (positions and hit states only: the count never depends on content) */
    int tail_from = T;
    for (int t = T - 1, seen = 0; t >= 0 && seen < o->tail; t--)
        if (state[t] != FRESH && !(in->exact && in->exact[t] && t != T - 1)) tail_from = t, seen++;
    for (int t = 0; t < T; t++) {
        if (state[t] != FRESH && in->exact && in->exact[t] && t != T - 1) { /* exact: reused as is */
            role[t] = 0;
            continue;
        }
        int reused = state[t] != FRESH;
        n_seg += reused && (in->seg_off ? in->seg_off[t] == 0 : t == 0 || state[t - 1] == FRESH); /* a segment's first token */
        int forced = t == T - 1 || (reused && t >= tail_from) ||
                     (o->method == CP_RECOMPUTE_EPIC && reused && in->seg_off && in->seg_off[t] < o->k_first);
        int candidate = o->method != CP_RECOMPUTE_FLAGGED || state[t] == RECOMPUTE;
        n_u += reused;
        forced_u += reused && forced;
        role[t] = !reused || forced ? 1 : candidate ? 2 : 0;
        n_ranked += role[t] == 2;
    }
    cp_recompute_opts eff = *o; /* R' = min(1, R + per_segment x s) */
    eff.r = o->r + o->per_segment * n_seg;
    if (eff.r > 1) eff.r = 1;
    long target = (long)ceil(eff.r * n_u);
    int k_end = (int)(target - forced_u < 0 ? 0 : target - forced_u > n_ranked ? n_ranked : target - forced_u);
    for (int t = 0; t < T; t++) /* nothing to rank: the kept ones are simply computed, the rest not at all */
        if (role[t] == 2 && (k_end == 0 || k_end == n_ranked)) role[t] = k_end ? 1 : 0;
    if (k_end == 0 || k_end == n_ranked) n_ranked = 0, k_end = 0;
    for (int t = 0; t < T; t++)
        if (role[t]) {
            p.tok[p.n] = in->ids[t], p.slot[p.n] = t, p.fixed[p.n] = role[t] == 1;
            p.n++;
        }
    schedule(&eff, L, n_ranked, n_u, forced_u, k_end, p.keep);
    cp_select_args a = { .tokens = p.tok, .pos = p.slot, .slots = p.slot, .n = p.n, .n_keys = T, .fixed = p.fixed, .keep = p.keep,
                         .ex = in->ex, .held = in->held };
    rc = cp_forward_select(m, st, &a, logits, p.depth, err);
    if (rc == CP_OK) {
        for (int t = 0; t < T; t++)
            if (state[t] != FRESH) state[t] = REUSED;
        for (int j = 0; j < p.n; j++) {
            int t = p.slot[j];
            if (state[t] == FRESH) continue;
            if (p.depth[j] == L) state[t] = RECOMPUTE;
            else stats->partial_rows += p.depth[j];
        }
        stats->reused_in = n_u, stats->forced = forced_u;
    }
    plan_free(&p), free(role);
    return rc;
}
