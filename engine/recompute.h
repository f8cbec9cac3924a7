/* Request-time recompute methods on top of the selective prefill
 * (model/forward_select.h).  Each decides which reused tokens are
 * recomputed in this request's context, and computes the prefill:
 *   gradual  CacheBlend's gradual filtering: every reused token runs the
 *            layers below the deviation layer; from there the set shrinks
 *            linearly from start x R to R of the reused tokens at the last
 *            layer, each step keeping the tokens whose K/V deviate most
 *   flagged  the cheap pass: only the tokens the stored flags name (the
 *            annotator's first k0 + top r) are candidates; R of the reused
 *            tokens are chosen among them at the deviation layer
 *   epic     the first k0 tokens of every reused segment are recomputed
 *            (EPIC: a segment's opening loses its context most), the rest of
 *            R by deviation at the deviation layer
 * Reused tokens whose KV is exact (a segment placed where it was computed,
 * at the start of the prompt: nothing but BOS before it, then and now) are
 * never recomputed or ranked: their deviation is zero.
 * The promise, for U the request's other reused tokens (including the last
 * prompt token when it was reused) and F the forced ones (the last token; the
 * last `tail` of U by position; epic: also each segment's first k0), and
 * R' = min(1, R + per_segment x s) for s the reused segments that are not
 * exact (hit positions only): exactly max(|F|, ceil(R' |U|)) tokens are
 * recomputed through every layer (flagged: max(|F|, min(ceil(R' |U|),
 * flagged))); per_segment 0: R' = R.  R = 0 computes nothing but the forced tokens; R = 1 is a
 * plain prefill. */
#ifndef CP_RECOMPUTE_H
#define CP_RECOMPUTE_H

#include <stdint.h>

#include "../model/forward_select.h"
#include "../model/model.h"

typedef enum cp_recompute_method {
    CP_RECOMPUTE_PLAN = 0, /* the plan's flags, or --recompute-by deviation (request.c) */
    CP_RECOMPUTE_GRADUAL,
    CP_RECOMPUTE_FLAGGED,
    CP_RECOMPUTE_EPIC,
} cp_recompute_method;

/* "attention", "deviation" (both CP_RECOMPUTE_PLAN; *deviation says which),
 * "gradual", "flagged", "epic" */
cp_status cp_recompute_from_name(const char *name, cp_recompute_method *out, int *deviation, cp_error *err);
const char *cp_recompute_name(cp_recompute_method m, int deviation);

typedef struct cp_recompute_opts {
    cp_recompute_method method;
    double r;      /* R, the fraction of reused tokens recomputed */
    double start;  /* gradual: the set starts at start x R (>= 1) */
    int layer;     /* the first layer where the set is ranked (>= 1) */
    int k_first;   /* epic: the first tokens of each reused segment */
    int tail;      /* every method: the last `tail` reused tokens of the prompt (by position; the
                      ones nearest the fresh question, which the first generated tokens attend to
                      most) are forced */
    double per_segment; /* every method: R grows by this for each reused segment that is not exact (a join
                           with context its KV was not computed after): R' = min(1, R + x s) */
} cp_recompute_opts;

typedef struct cp_recompute_in {
    const int32_t *ids;
    int T;
    const uint8_t *seg_off; /* [T]: a reused token's offset in its segment, capped at 255 (epic) */
    const uint8_t *exact;   /* [T] or NULL: 1 = reused KV computed in this very context */
    const cp_export *ex;    /* the annotator's export (fresh rows), or NULL */
    cp_select_held *held;   /* optional, with ex: the export kept here for later (cp_select_held_deliver) */
} cp_recompute_in;

typedef struct cp_recompute_stats {
    int reused_in;    /* |U| */
    int forced;       /* |F| */
    int partial_rows; /* token-layers computed for tokens that end reused (the selection's cost) */
} cp_recompute_stats;

/* state (per prompt token: 0 fresh, 1 reused, 2 recomputed, as planned;
 * reused tokens' KV placed in st at slot = position) is rewritten with the
 * method's choice; logits receive the last token's. */
cp_status cp_recompute_prefill(cp_model *m, cp_state *st, const cp_recompute_opts *o, const cp_recompute_in *in, uint8_t *state,
                               float *logits, cp_recompute_stats *stats, cp_error *err);

#endif
