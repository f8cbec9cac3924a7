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
    struct cp_select_held *held; /* optional, with ex: the export is kept here instead of delivered */
} cp_select_args;

/* A selective prefill's export kept for later (cp_select_args.held): the
 * fixed candidates' rows (n x n_keys floats), their slots and sensitive
 * masses.  An exporting caller whose consumer reads the rows only after
 * the first token (the annotator) delivers them then, so their summing is
 * not part of the wait for it.  Zero-initialise; free with
 * cp_select_held_free (a no-op on an empty one). */
typedef struct cp_select_held {
    float *E, *sensm;
    int32_t *slots;
    int n, n_keys, run; /* run: the most rows one rows() call takes (the state's chunk) */
} cp_select_held;

/* The kept rows to ex as cp_forward_select would have delivered them
 * (ex->sens_mass first, then rows() over runs of wanted rows), then freed. */
cp_status cp_select_held_deliver(cp_select_held *h, const cp_export *ex, cp_error *err);
void cp_select_held_free(cp_select_held *h);

/* logits (host, vocab floats) for the last candidate; depth[i] (optional)
 * the number of layers candidate i was computed at.  Afterwards s->n =
 * max(s->n, n_keys).  The export holds the fixed rows (fixed x n_keys
 * floats) on the host while the layers run. */
cp_status cp_forward_select(cp_model *m, cp_state *s, const cp_select_args *a, float *logits, uint8_t *depth, cp_error *err);

#endif
