/* The selective prefill: CacheBlend's gradual filtering in one pass.
 * Candidates (tokens whose placed KV may be refreshed, and the tokens that
 * must be computed) run layer by layer; before layer l the non-fixed
 * candidates still in the set are ranked by how far their layer-l K/V
 * (projected from their current hidden states) lie from the KV the cache
 * holds for them, and only the top keep[l] go on.  A token dropped at layer
 * l keeps its placed KV from layer l up and its in-context KV below. */
#ifndef CP_FORWARD_SELECT_H
#define CP_FORWARD_SELECT_H

#include "model.h"

typedef struct cp_select_args {
    const int32_t *tokens, *pos, *slots; /* n candidates, slots and positions ascending, slots < n_keys */
    int n, n_keys;
    const uint8_t *fixed;   /* [n]: computed at every layer, never ranked; the last candidate must be fixed */
    const int *keep;        /* [n_layers]: non-fixed candidates computed at layer l; keep[0] is all of them,
                               never increasing */
    const cp_export *ex;    /* optional, as cp_forward_at's, delivered for the fixed candidates only */
} cp_select_args;

/* logits (host, vocab floats) for the last candidate; depth[i] (optional)
 * the number of layers candidate i was computed at.  Afterwards s->n =
 * max(s->n, n_keys).  The export holds the fixed rows (fixed x n_keys
 * floats) on the host while the layers run. */
cp_status cp_forward_select(cp_model *m, cp_state *s, const cp_select_args *a, float *logits, uint8_t *depth, cp_error *err);

#endif
