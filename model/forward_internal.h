/* The layer loop (forward_layer.c) and the pieces around it shared by
 * forward.c (one sequence: a step of one), forward_batch.c (several
 * sequences in one step) and forward_select.c (layer by layer over
 * shrinking token sets).  Not part of the model API: model/ only. */
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
 * least `rows` rows of n_keys floats, s->export_rows `rows` ints. */
cp_status grow_export(cp_model *m, cp_state *s, size_t rows, int n_keys, cp_error *err);
/* One sequence's rows in a step of the layer loop: rows [off, off + n) of
 * the step, computed at cache slots `slots` of state s and attending to
 * its slots [0, n_keys); ex (NULL: none) exports n_export layers into s's
 * export scratch, with sens_mass when want_sens. */
typedef struct cp_fwd_seq {
    cp_state *s;
    int off, n;
    const int32_t *slots;
    int n_keys;
    const cp_export *ex;
    int n_export, want_sens;
    /* optional (a backend whose buffers are host memory): the export of
     * wanted row r is added straight into ex_to's row ex_row[r] (stride
     * n_keys) and its mass into sens_to[ex_row[r]], across layers, instead
     * of into the state's per-chunk buffers; a run of wanted rows has
     * consecutive ex_row */
    float *ex_to, *sens_to;
    const int *ex_row;
    /* The final layer only: the sequence's first skip_out rows are read by
     * nobody after it -- no logits, no next layer -- so they need only their
     * K and V (and their attention where the export wants it), not the
     * output projection and MLP; 0: every row runs whole */
    int skip_out;
} cp_fwd_seq;

/* The rows of one step: T rows of activations in backend memory (x the
 * hidden states; xn, q, att, kt, vt, gate, up scratch), their RoPE tables
 * [T, head_dim/2] and query positions [T] uploaded, the sequences they
 * belong to, and args, room for one attention call per sequence. */
typedef struct cp_fwd_rows {
    int T;
    float *x, *xn, *q, *att, *kt, *vt, *gate, *up;
    const float *cos, *sin;
    const int32_t *qpos;
    const cp_fwd_seq *seqs;
    int n_seqs;
    cp_attn_args *args;
} cp_fwd_rows;

/* Layer l over the step's rows: the fused norm and Q/K/V projections, each
 * sequence's K (before and after RoPE) and V into its cache at its slots,
 * attention per sequence over its own cache, then x += attention and MLP.
 * Every forward path (one sequence, a batched step, the selective prefill,
 * the deviation probe's lower layers) runs this. */
void cp_fwd_layer(cp_model *m, const cp_fwd_rows *r, int l);
/* layers [l0, l1) */
void cp_fwd_layers(cp_model *m, const cp_fwd_rows *r, int l0, int l1);
/* The rows of one sequence's chunk of n tokens in its own state's scratch
 * (s->x ... s->up, s->cos, s->sin, s->qpos): a step of one.  q and args are
 * the caller's, and live as long as r is used. */
void cp_fwd_state_rows(cp_state *s, int n, const int32_t *slots, int n_keys, const cp_export *ex, int n_export, int want_sens,
                       cp_fwd_seq *q, cp_attn_args *args, cp_fwd_rows *r);

/* outs[j].y = rmsnorm(x; norm_w) . W_j^T + bias_j for j < count: the
 * backend's fused op where it takes these, else the norm into xn and one
 * matmul each. */
void cp_fwd_norm_matmuls(cp_backend *be, float *xn, const float *x, const float *norm_w, float eps, int n, int in, const cp_mm_out *outs,
                         int count);

/* The deviation probe at layer l for n rows whose hidden states are in
 * s->x: layer l's K (before RoPE) and V projected from them as the layer
 * loop projects them, against what s's cache holds at slots[i] for layer
 * l; dev[i] the squared distance relative to the fresh vectors' squared
 * norm.  host: 4 n kv_dim floats of scratch; s->xn, s->kt, s->vt too. */
cp_status cp_fwd_kv_deviation(cp_model *m, cp_state *s, int l, int n, const int32_t *slots, float *dev, float *host, cp_error *err);
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
