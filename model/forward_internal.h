/* The layer loop's pieces that another forward pass in model/ reuses
 * (forward_select.c runs them layer by layer over shrinking token sets);
 * not part of the model API. */
#ifndef CP_FORWARD_INTERNAL_H
#define CP_FORWARD_INTERNAL_H

#include "model.h"

/* The attention export scratch (s->export_tmp, s->export_host) holds at
 * least `floats` floats. */
cp_status grow_export(cp_model *m, cp_state *s, size_t floats, cp_error *err);
/* One layer over the chunk's n tokens whose hidden states are in s->x (see
 * forward.c). */
void layer_forward(cp_model *m, cp_state *s, int l, int n, const int32_t *slots, int n_keys, const cp_export *ex, int n_export,
                   int want_sens);
/* The chunk's positions, RoPE tables, ids and key positions to the backend. */
cp_status chunk_inputs(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n, int n_keys,
                       cp_error *err);
/* The arguments of a computation at given slots, as cp_forward_at checks them. */
cp_status check_at(const cp_model *m, const cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                   int n_keys, cp_error *err);

#endif
