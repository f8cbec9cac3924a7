/* A loaded checkpoint on a backend, per-request state (KV cache), and the
 * forward pass (one layer loop for prefill, chunked prefill and decode). */
#ifndef CP_MODEL_H
#define CP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/backend.h"
#include "config.h"

typedef struct cp_layer_weights {
    float *attn_norm, *mlp_norm;        /* [hidden] f32 */
    cp_matrix wq, wk, wv, wo;           /* matrix dtype, in the backend's layout */
    float *bq, *bk, *bv;                /* Qwen2 biases, else NULL */
    cp_matrix w_gate, w_up, w_down;     /* matrix dtype, in the backend's layout */
} cp_layer_weights;

typedef struct cp_model {
    cp_config cfg;
    cp_backend *be; /* not owned */
    cp_matrix embed;   /* [vocab, hidden] */
    cp_matrix lm_head; /* [vocab, hidden]; the same data as embed when tied */
    float *final_norm;
    cp_layer_weights *layers;
    double *rope_inv_freq; /* host, head_dim/2 */
    /* host, rope_rows x head_dim/2 each: cos and sin of every position
     * below rope_rows, filled up to the highest position a pass has asked
     * for (forward.c, rope_tables): a selective prefill asks for the same
     * positions once per layer, and each is head_dim cos/sin in double */
    float *rope_cos, *rope_sin;
    int rope_rows;
    size_t weight_bytes;   /* backend bytes held by weights */
    /* SHA-256 of config.json and the tensor table (names, dtypes, shapes,
     * and bytes sampled from each tensor's data): part of every pool key,
     * so KV from one model never serves another, fine-tunes included */
    uint8_t fingerprint[32];
    int n_leftover;        /* checkpoint tensors the architecture did not use */
    cp_dtype matrix_dtype; /* the backend's when loaded: a forward pass refuses a backend since switched */
} cp_model;

/* The dtype matrices are held and computed from (--dtype):
 *   BACKEND (0)  whatever the backend has now (f32 on CPU): the library's
 *                default, so tests stay the exact f32 reference
 *   AUTO         as stored: bf16 when every matrix of the checkpoint is
 *                BF16 or F16 (f16 rounded to bf16), else f32 — never
 *                rounds f32 data; a backend that cannot switch keeps its own
 *   F32, BF16    converted to that
 *   INT8         every matrix -- the embedding and the LM head too --
 *                quantized at load, one scale per row (kernels/q8.h), on
 *                the CPU backend; auto never picks it */
typedef enum cp_weight_dtype { CP_WEIGHTS_BACKEND = 0, CP_WEIGHTS_AUTO, CP_WEIGHTS_F32, CP_WEIGHTS_BF16, CP_WEIGHTS_INT8 } cp_weight_dtype;

/* "auto", "f32", "bf16", "int8" */
cp_status cp_weight_dtype_from_name(const char *name, cp_weight_dtype *out, cp_error *err);
/* The matrix dtype --dtype auto loads dir's checkpoint in (bf16 where every
 * matrix is stored in 16 bits, else f32), from its headers alone. */
cp_status cp_model_stored_dtype(const char *dir, cp_dtype *out, cp_error *err);

typedef struct cp_load_opts {
    /* called after each tensor with bytes read so far and in all */
    void (*progress)(void *ctx, size_t done, size_t total);
    void *progress_ctx;
    cp_weight_dtype dtype;
} cp_load_opts;

cp_status cp_model_load(const char *dir, cp_backend *be, const cp_load_opts *opts, cp_model **out, cp_error *err);
void cp_model_free(cp_model *m);

/* One weight tensor of a model: where its backend pointer lives, its shape,
 * and whether it is a matrix (in the backend's matrix dtype; mat its
 * handle, whose data slot points at) or an f32 vector (mat NULL).  cp_model_tensor_refs lists them in one fixed order (embedding,
 * the output head when untied, final norm, then per layer: the two norms,
 * q, k, v, o, the q/k/v biases when the config has them, gate, up, down) —
 * the order the device check's weight pack uses; m->layers must exist.
 * Returns how many there are; writes at most cap of them. */
typedef struct cp_tensor_ref {
    const char *what;
    void **slot;
    int64_t rows, cols; /* cols 1 for vectors */
    int matrix;
    cp_matrix *mat;
} cp_tensor_ref;

size_t cp_model_tensor_refs(cp_model *m, cp_tensor_ref *out, size_t cap);

/* Per-request state: the KV cache (K after RoPE) and scratch.  Slots fill in
 * order; each slot remembers the position its token was computed at.
 * The cache's element type is kv_dtype (--kv-dtype): f32 (k, v, k_pre set;
 * k16, v16, k_pre16 NULL) or bf16 (the other way round), half the bytes per
 * token.  A bf16 cache stores K_pre and V rounded to nearest even from the
 * f32 projections, and K = bf16(RoPE(f32(K_pre))); attention widens them
 * (exactly) and computes in f32. */
typedef struct cp_state {
    int capacity;  /* slots */
    int max_batch; /* tokens per internal chunk */
    int n;         /* slots filled */
    int dirty;     /* slots [0, dirty) may hold KV; the rest are zero (cp_state_reset zeroes only these) */
    int32_t next_pos;
    cp_dtype kv_dtype;   /* CP_F32 or CP_BF16 */
    float *k, *v;        /* [layers][capacity][kv_dim]; K after RoPE */
    float *k_pre;        /* [layers][capacity][kv_dim]: K before RoPE, what the pool stores */
    uint16_t *k16, *v16, *k_pre16; /* the same, for a bf16 cache */
    float *kt, *vt;      /* [max_batch][kv_dim] projection scratch */
    int32_t *qpos;       /* backend [max_batch]: the chunk's positions */
    int32_t *pos;        /* backend [capacity] */
    int32_t *pos_host;   /* host mirror */
    /* scratch (backend) */
    float *x, *xn, *q, *att, *gate, *up, *logits, *cos, *sin;
    int32_t *ids;
    float *cos_host, *sin_host;
    float *export_tmp; size_t export_tmp_floats; /* backend, grown on demand */
    float *export_host; size_t export_host_floats;
    int32_t *export_rows; size_t export_rows_cap;  /* host: a call's rows' export rows (cp_attn_args.export_rows) */
    uint8_t *sens_dev; float *sens_mass_dev;       /* backend [capacity], made on first use */
} cp_state;

cp_status cp_state_create(const cp_model *m, int capacity, int max_batch, cp_state **out, cp_error *err); /* f32 KV */
/* kv_dtype CP_F32 or CP_BF16; CP_EUNSUPPORTED for bf16 on a backend without
 * bf16 KV ops (kernels/backend.h: CUDA) */
cp_status cp_state_create_kv(const cp_model *m, int capacity, int max_batch, cp_dtype kv_dtype, cp_state **out, cp_error *err);
/* One cache row (kv_dim elements of s->kv_dtype) in backend memory: which 0
 * = K before RoPE (what the pool stores), 1 = V, 2 = K after RoPE. */
void *cp_state_kv_row(const cp_model *m, const cp_state *s, int which, int layer, int slot);
/* n rows from slot on of one layer's cache (which as above) into dst (host,
 * n * kv_dim floats), widened to f32 from a bf16 cache (exact). */
cp_status cp_state_read_kv(const cp_model *m, const cp_state *s, int which, int layer, int slot, int n, float *dst, cp_error *err);
/* Zeroes the KV (it may hold sensitive tokens' KV) and empties the state. */
cp_status cp_state_reset(const cp_model *m, cp_state *s, cp_error *err);
void cp_state_free(const cp_model *m, cp_state *s); /* zeroes KV first */

typedef enum cp_logits_mode { CP_LOGITS_NONE = 0, CP_LOGITS_LAST, CP_LOGITS_ALL } cp_logits_mode;

/* Attention export: rows = query slots, columns = key slots (row stride ld).
 * The forward pass writes, for each query it computes, the attention
 * probabilities averaged over heads and over the selected layers. */
typedef struct cp_export {
    float *a;               /* host */
    int ld;
    const uint8_t *layers;  /* [n_layers] flags; NULL = all layers */
    /* optional: per key slot, 1 = sensitive (host, [capacity]); then
     * sens_mass[slot] (host) receives, for each query computed, the max over
     * heads and exported layers of the mass on sensitive slots */
    const uint8_t *sensitive;
    float *sens_mass;
    /* a is backend memory (the export stays where it was computed, for a
     * backend with annot_open); sensitive and sens_mass stay host */
    int a_on_backend;
    /* optional, instead of a: each chunk's finished rows (host memory, n
     * rows of n_keys columns, row stride ld; row k is slot slots[k]) go to
     * rows(), after the chunk's sens_mass is stored — so a caller keeps
     * only what it needs of them (the annotator's band: O(T x max_len)
     * instead of T x T).  The forward pass holds one chunk's rows at a time.
     * A row want leaves out is zero, and may not be passed: slots ascend
     * across the calls, and a slot never passed is a zero row. */
    cp_status (*rows)(void *ctx, const float *rows, size_t ld, const int32_t *slots, int n, cp_error *err);
    void *rows_ctx;
    /* optional, per query slot (host, [capacity]): 0 = nobody reads this
     * query's row, so on a backend with CP_BE_ATTN_EXPORT_ONLY it is not
     * exported (its export row stays zero, its sens_mass 0); NULL = every
     * row.  The request path passes the fresh tokens: the annotator cuts
     * runs at every other token before it reads a row. */
    const uint8_t *want;
} cp_export;

/* Appends n tokens at slots [s->n, s->n+n), at positions pos (NULL: continue
 * from the last position + 1).  logits (host) receives vocab floats for the
 * last token (CP_LOGITS_LAST) or n*vocab for all (CP_LOGITS_ALL). */
cp_status cp_forward(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, int n, cp_logits_mode mode,
                     float *logits, const cp_export *ex, cp_error *err);

/* The reuse prefill: computes n tokens at the given slots (ascending, each
 * < n_keys) and positions (ascending), their queries attending to every slot
 * in [0, n_keys) causally by position — KV placed there with
 * cp_state_place included.  Slots it does not compute must have been
 * placed.  Afterwards s->n = max(s->n, n_keys). */
cp_status cp_forward_at(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                        int n_keys, cp_logits_mode mode, float *logits, const cp_export *ex, cp_error *err);

/* Placeholder KV (zeros) placed at slot = position i for every i with
 * reused[i], in runs of at most `run` rows as pool blocks would be: plan
 * replay at real scale, where the placement's cost is real and the values
 * are not.  The zeros live in backend memory, so it works on any backend. */
cp_status cp_state_place_placeholder(cp_model *m, cp_state *s, const uint8_t *reused, int n, int run, cp_error *err);

/* Which reused tokens lost the most context (CacheBlend's selection): runs
 * layers [0, layer) for n tokens at their slots and positions as
 * cp_forward_at does (writing those layers' K/V at the slots), then projects
 * K (before RoPE) and V of `layer` and writes per token the squared distance
 * to what the cache holds at its slot for that layer, relative to the fresh
 * vectors' squared norm.  Layers from `layer` up are not touched. */
cp_status cp_forward_deviation(cp_model *m, cp_state *s, const int32_t *tokens, const int32_t *pos, const int32_t *slots, int n,
                               int n_keys, int layer, float *dev, cp_error *err);

/* Places KV computed elsewhere into slots [slot0, slot0 + n) at positions
 * pos[0..n): for each layer, n rows of K before RoPE (k_pre[layer]) and V
 * (v[layer]), `ld` floats apart, in backend memory.  K is rotated once, to
 * its new position, from the stored unrotated values. */
cp_status cp_state_place(cp_model *m, cp_state *s, int slot0, int n, const int32_t *pos, const float *const *k_pre,
                         const float *const *v, size_t ld, cp_error *err);  /* f32 cache only */
/* The same in the state's own KV dtype: rows of kv_dim elements of
 * s->kv_dtype, ld elements apart (what the pool of that dtype holds). */
cp_status cp_state_place_kv(cp_model *m, cp_state *s, int slot0, int n, const int32_t *pos, const void *const *k_pre,
                            const void *const *v, size_t ld, cp_error *err);
/* One run of a placement: n rows into slots [slot0, slot0 + n) at
 * positions pos[0..n), per layer from k_pre[layer] and v[layer]. */
typedef struct cp_kv_run {
    int slot0, n;
    const int32_t *pos;
    const void *const *k_pre, *const *v; /* [n_layers] each */
} cp_kv_run;
/* cp_state_place_kv for each run, the same bits.  On a backend of host
 * memory, with each run's positions consecutive (a pool block's), the
 * runs' layers go to the threads with RoPE's rows read from the model's
 * table: a reused prompt's placement is a memory-bound copy (~11 MB for
 * 720 tokens of cp-books-6m), which one core left at its own bandwidth. */
cp_status cp_state_place_kv_runs(cp_model *m, cp_state *s, const cp_kv_run *runs, int n_runs, size_t ld, cp_error *err);

/* ---- continuous batching: one step for several sequences (forward_batch.c) ----
 *
 * One sequence of a step: n tokens for state s, which no other sequence of
 * the step may share.  Append mode (slots NULL): as cp_forward, the tokens
 * go to slots [s->n, s->n + n) at positions pos (NULL: continuing from the
 * last position + 1), their keys ending at their own last slot.  Slot mode
 * (slots given, pos required): as one chunk of cp_forward_at, the tokens are
 * computed at slots (ascending, each < n_keys) attending to [0, n_keys)
 * causally by position; a reuse prefill cut into chunks over several steps
 * first gives every computed slot its position with cp_state_set_positions
 * (cp_forward_at does that for all its chunks at once).  logits (host) gets
 * vocab floats for the last token (CP_LOGITS_LAST) or n*vocab (ALL); ex as
 * for cp_forward_at (the state's export scratch holds the chunk's rows). */
typedef struct cp_batch_seq {
    cp_state *s;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *slots;
    int n, n_keys;
    cp_logits_mode mode;
    float *logits;
    const cp_export *ex;
} cp_batch_seq;

/* The step's scratch (activations of every token of a step), apart from
 * the per-sequence states: sized for max_tokens tokens a step. */
typedef struct cp_batch_ws cp_batch_ws;

cp_status cp_batch_ws_create(const cp_model *m, int max_tokens, cp_batch_ws **out, cp_error *err);
void cp_batch_ws_free(const cp_model *m, cp_batch_ws *ws);
int cp_batch_ws_max_tokens(const cp_batch_ws *ws);

/* One step: the embedding, norms, Q/K/V/O projections, MLP and LM head run
 * once over all the step's tokens (every sequence's, concatenated); RoPE
 * per token at its own position; attention per sequence over its own cache,
 * each sequence's K/V written into its own state.  The result for each
 * sequence is what cp_forward / cp_forward_at would give it alone (up to
 * the GEMM's summation order).  Nothing is computed when an argument is bad. */
cp_status cp_forward_batch(cp_model *m, cp_batch_ws *ws, const cp_batch_seq *seqs, int n_seqs, cp_error *err);

/* Gives slots[i] the position pos[i] (each slot < s->capacity), for a reuse
 * prefill that the caller cuts into chunks (see cp_batch_seq). */
cp_status cp_state_set_positions(cp_state *s, const int32_t *slots, const int32_t *pos, int n, cp_error *err);

#endif
