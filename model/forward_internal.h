/* Pieces of the layer loop shared by forward.c (one sequence),
 * forward_batch.c (several sequences in one step) and forward_select.c
 * (layer by layer over shrinking token sets).  Not part of the model API:
 * model/ only. */
#ifndef CP_FORWARD_INTERNAL_H
#define CP_FORWARD_INTERNAL_H

#include "model.h"

#define CP_MAX_POSITION (1 << 30)

/* ids inside the vocabulary, positions (pos may be NULL) in [0, CP_MAX_POSITION) */
cp_status cp_fwd_check_tokens(const cp_model *m, const int32_t *tokens, const int32_t *pos, int n, cp_error *err);

/* Copies rows [0, n) of src (row stride src_ld floats) to slots[i] of dst
 * (rows of `row` floats); runs of consecutive slots go in one copy. */
void cp_fwd_scatter_rows(cp_backend *be, float *dst, const float *src, size_t src_ld, const int32_t *slots, int n, size_t row);

/* Stores rows [0, n) of f32 scratch src (row stride src_ld) at slots[i] of
 * one layer's cache array `which` (0 K_pre, 1 V, 2 K) in the state's KV
 * dtype; a bf16 cache rounds src in place to the stored values. */
void cp_fwd_store_kv(cp_model *m, cp_state *s, int which, int layer, float *src, size_t src_ld, const int32_t *slots, int n);
/* a's K and V (k/v or k16/v16) for one layer of s's cache */
void cp_fwd_attn_kv(const cp_model *m, const cp_state *s, int layer, cp_attn_args *a);

/* Attention export of one chunk of n queries over n_keys keys in state s:
 * begin readies s's export scratch (zeroed) and, when ex asks for it, the
 * sensitive columns (n_export: how many layers export; want_sens: whether
 * sens_mass is computed); end delivers the chunk's rows and sens_mass to ex
 * after the layers ran.  ex NULL: nothing. */
cp_status cp_fwd_export_begin(cp_model *m, cp_state *s, const cp_export *ex, int n, int n_keys, int *n_export, int *want_sens,
                              cp_error *err);
cp_status cp_fwd_export_end(cp_model *m, cp_state *s, const cp_export *ex, const int32_t *slots, int n, int n_keys, int want_sens,
                            cp_error *err);

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

/* The rest of a layer after attention, over n rows: x += att . Wo^T (closing
 * the "attention" profiler range), then x += MLP(rmsnorm(x)) in its own
 * "mlp" range; xn, gate and up are scratch.  One sequence's chunk and a
 * batched step's rows run the same code. */
void cp_fwd_attn_out_mlp(cp_model *m, const cp_layer_weights *w, int n, float *x, float *xn, const float *att, float *gate, float *up);

#endif
