/* The table of operations a compute backend provides (ggml-style split of
 * backend from graph).  model/ drives the layer loop through this table only;
 * it never includes CUDA headers.  The CPU backend (kernels/cpu) is the
 * reference; the CUDA backend (kernels/cuda) fills the same table.
 *
 * Pointers passed to ops are backend memory (from alloc): host memory for the
 * CPU backend, device memory for CUDA.  Ops are void and may be queued; an op
 * that fails records a sticky error which the next sync() reports, so the hot
 * loop carries no error plumbing (the CUDA runtime works the same way).
 *
 * Layouts are row-major.  Activations are f32.  "Matrix" weights (projection
 * and embedding tables) are in `matrix_dtype`, chosen by the backend (f32 on
 * CPU unless a model is loaded in bf16, bf16 on CUDA); vectors (norm
 * weights, biases) are always f32. */
#ifndef CP_BACKEND_H
#define CP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "annot_dev.h"
#include "dtype.h"
#include "status.h"

typedef struct cp_backend cp_backend;

/* What a backend can do beyond the op table's contract, as bits of
 * cp_backend.flags; model/ asks these instead of recognising a backend.
 * They may change with set_matrix_dtype (the backend updates them). */
enum {
    /* embed reads the rows of a matrix pack_matrix made: a tied embedding
     * is packed once, as the LM head, and serves both */
    CP_BE_EMBED_READS_PACKED = 1u << 0,
    /* int8 matrices are loaded in the vnni panel order (kernels/q8.h,
     * CP_Q8_PANELS), which only this backend's kernels read */
    CP_BE_Q8_PANELS = 1u << 1,
    /* attention exports (and masses) a call's rows only, each row's as it
     * would be in any other call, and takes out == NULL when export_a or
     * sens_mass is set (then computes only those): the forward asks the
     * rows the annotator reads for their export, in their own calls */
    CP_BE_ATTN_EXPORT_ONLY = 1u << 2,
    /* buffers are host memory: a host buffer may stand where a backend
     * one is asked for (an export accumulated straight into the caller's
     * rows) */
    CP_BE_HOST_MEMORY = 1u << 3,
    /* attention with output rows takes cp_attn_args.export_rows: the rows
     * an export wants come in one call with the others */
    CP_BE_ATTN_EXPORT_ROWS = 1u << 4,
};

/* One attention call: n queries against the first n_keys slots of one
 * layer's cache.  Key j is visible to query i when
 *   k_pos[j] <= q_pos[i]  and  (window == 0 || k_pos[j] > q_pos[i] - window)
 * i.e. causal by position, not by slot, so reused KV placed anywhere in the
 * cache is attended exactly as if it had been computed in place. */
typedef struct cp_attn_args {
    const float *q;       /* [n, n_heads*head_dim], RoPE applied */
    const float *k;       /* [n_keys, n_kv_heads*head_dim], RoPE applied */
    const float *v;       /* [n_keys, n_kv_heads*head_dim] */
    const int32_t *q_pos; /* [n] */
    const int32_t *k_pos; /* [n_keys] */
    float *out;           /* [n, n_heads*head_dim] */
    int n, n_keys, n_heads, n_kv_heads, head_dim, window;
    /* Attention export (the annotator's input): when export_a is not NULL,
     * export_a[i*export_ld + j] += export_weight * p_h(i, j) for every head h.
     * With export_weight = 1/(n_heads * n_layers_exported) the sum over the
     * exported layers is the head- and layer-mean of the probabilities. */
    float *export_a;
    int export_ld;
    float export_weight;
    /* Sensitive mass: when sens_mass is not NULL, sens_mass[i] becomes the
     * max of itself and, for every head, that head's probability mass on
     * key slots j with sens_cols[j] set.  Called for each exported layer,
     * this is the max over heads and layers (an average would hide one head
     * copying a name). */
    const uint8_t *sens_cols; /* [n_keys] */
    float *sens_mass;         /* [n] */
    /* A bf16 KV cache (--kv-dtype bf16) instead of k and v (which are then
     * NULL): same layout, bf16 elements, widened to f32 on load (exact) and
     * attended in f32.  Only a backend with kv_store_bf16 is handed these
     * (last, so positional initializers of the fields above stand). */
    const uint16_t *k16, *v16;
    /* With an export or a mass, on a backend with CP_BE_ATTN_EXPORT_ROWS:
     * row i adds into row export_rows[i] of export_a and sens_mass, or
     * nowhere when it is negative (NULL: row i into row i). */
    const int32_t *export_rows;
} cp_attn_args;

/* A weight matrix W [rows, cols] (rows = a product's outputs, cols its
 * inputs) in backend memory, with the dtype and the layout its bytes are
 * in: pack_matrix returns one and matmul, embed and the fused ops take one,
 * so the layout travels with the tensor (as in ggml's backend buffers) and
 * no op has to find out how a matrix was stored.  layout CP_LAYOUT_ROWS is
 * row-major as loaded (an int8 blob, kernels/q8.h, names its own order in
 * its header); any other value is private to the backend whose
 * pack_matrix made it. */
typedef struct cp_matrix {
    void *data;
    cp_dtype dtype;
    int rows, cols;
    int layout;
} cp_matrix;

#define CP_LAYOUT_ROWS 0

/* a row-major matrix over data */
static inline cp_matrix cp_matrix_rows(void *data, cp_dtype dtype, int rows, int cols)
{
    cp_matrix m = { data, dtype, rows, cols, CP_LAYOUT_ROWS };
    return m;
}

/* one product of a fused op: y (row stride ldy) = src . W^T (+ bias),
 * W [out, in] in matrix_dtype, bias f32 or NULL */
typedef struct cp_mm_out {
    float *y;
    int ldy;
    const cp_matrix *w;
    const float *bias;
    int out;
} cp_mm_out;

struct cp_backend {
    const char *name;
    cp_dtype matrix_dtype;
    unsigned flags; /* CP_BE_* */
    void *impl;

    void (*destroy)(cp_backend *be);

    /* memory */
    cp_status (*alloc)(cp_backend *be, size_t bytes, void **out, cp_error *err);
    void (*free)(cp_backend *be, void *p);
    cp_status (*upload)(cp_backend *be, void *dst, const void *src_host, size_t bytes, cp_error *err);
    cp_status (*download)(cp_backend *be, void *dst_host, const void *src, size_t bytes, cp_error *err);
    void (*copy)(cp_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(cp_backend *be, void *dst, size_t bytes);
    /* Waits for queued work; returns (and clears) the first sticky error. */
    cp_status (*sync)(cp_backend *be, cp_error *err);

    /* ops */
    /* out[i,:] = table[ids[i],:] (ids already checked against the vocab) */
    void (*embed)(cp_backend *be, float *out, const cp_matrix *table, const int32_t *ids, int n, int dim);
    /* out[i,:] = x[i,:] / rms(x[i,:]) * w  (out may equal x) */
    void (*rmsnorm)(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
    /* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + x[i,:] . W^T + bias
     * with W [out, in] in matrix_dtype, bias f32 or NULL. */
    void (*matmul)(cp_backend *be, float *y, int ldy, const float *x, const cp_matrix *w, const float *bias, int n, int in,
                   int out, int accumulate);
    /* HF rotate-half RoPE in place on n rows of n_heads heads (row stride ld);
     * cos/sin are [n, head_dim/2]. */
    void (*rope)(cp_backend *be, float *x, int ld, const float *cos, const float *sin, int n, int n_heads, int head_dim);
    void (*attention)(cp_backend *be, const cp_attn_args *a);
    /* Optional (NULL: the caller calls attention once per item): count
     * attention calls of one batched step, a[c] each with its own cache,
     * positions, window, export and sensitive columns, every output as
     * attention(be, &a[c]) gives it, bit for bit.  The items' outputs,
     * exports and sens_mass must not overlap.  Why: a decode row is only
     * n_kv_heads work items, so one call per sequence per layer is a fork
     * and join per sequence; here the CPU backend runs every decode row of
     * the step in one parallel region. */
    void (*attention_batch)(cp_backend *be, const cp_attn_args *a, int count);
    /* out[i,:] = silu(gate[i,:]) * up[i,:]  (n*dim contiguous elements) */
    void (*swiglu)(cp_backend *be, float *out, const float *gate, const float *up, size_t count);
    /* Optional fused ops: NULL, or returning 0 (nothing done) where the
     * backend does not fuse these arguments -- the caller then runs the
     * plain ops.  Returning 1 they did what the plain ops would, to the
     * backend's own rounding, without storing the intermediate rows:
     * norm_matmuls: outs[j].y = rmsnorm(x; norm_w, eps) . W_j^T + bias_j
     * for j < count (1..4); swiglu_matmul: y = (accumulate ? y : 0) +
     * swiglu(gate, up) . W^T (gate and up n x in, contiguous). */
    int (*norm_matmuls)(cp_backend *be, const float *x, const float *norm_w, float eps, int n, int in, const cp_mm_out *outs,
                        int count);
    int (*swiglu_matmul)(cp_backend *be, float *y, int ldy, const float *gate, const float *up, const cp_matrix *w, int n, int in,
                         int out, int accumulate);
    /* mlp: x += swiglu(rmsnorm(x) . gate^T, rmsnorm(x) . up^T) . down^T
     * (gate, up [inter x hidden], down [hidden x inter]): the layer's MLP
     * with neither gate nor up stored -- the norm_matmuls and
     * swiglu_matmul above in turn, to the bit where the backend takes it. */
    int (*mlp)(cp_backend *be, float *x, const float *norm_w, float eps, int n, int hidden, const cp_matrix *gate, const cp_matrix *up,
               const cp_matrix *down, int inter);
    /* Places n rows of reused KV into one layer's cache rows (contiguous,
     * n_kv_heads*head_dim floats each): k_pre and v copied from src rows
     * src_ld floats apart, k = RoPE(k_pre) with cos/sin [n, head_dim/2] —
     * one pass, so reuse costs one read of the stored KV. */
    void (*place_kv)(cp_backend *be, float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld, int n,
                     const float *cos, const float *sin, int n_kv_heads, int head_dim);

    /* optional: NULL where a backend has none */
    /* A bf16 KV cache (--kv-dtype bf16): a backend sets both, and then its
     * attention reads cp_attn_args.k16/v16; cp_state_create refuses bf16 KV
     * on a backend without them (CUDA keeps an f32 cache).
     * kv_store_bf16: dst[i] = bf16(src[i]) rounded to nearest even, and
     * src[i] = f32(dst[i]) — the scratch keeps exactly what the cache holds,
     * so RoPE applied to it afterwards rotates the stored K_pre, as
     * placement does.  place_kv_bf16: place_kv over bf16 rows, k =
     * bf16(RoPE(f32(k_pre))) — rotated in f32 and rounded once. */
    void (*kv_store_bf16)(cp_backend *be, uint16_t *dst, float *src, size_t count);
    void (*place_kv_bf16)(cp_backend *be, uint16_t *k, uint16_t *k_pre, uint16_t *v, const uint16_t *src_k, const uint16_t *src_v,
                          size_t src_ld, int n, const float *cos, const float *sin, int n_kv_heads, int head_dim);
    /* profiler ranges (NVTX on CUDA; free when no tool is attached) */
    void (*range_push)(cp_backend *be, const char *name);
    void (*range_pop)(cp_backend *be);
    /* One id from logits[0, n) (backend memory), synchronously: temperature
     * 0 = argmax (lowest index on ties); else p = softmax(logits / T), keep
     * the smallest set of the most probable ids whose mass reaches top_p
     * (ties at the threshold all kept), and take the id where u in [0, 1)
     * times the kept mass falls, walking the kept ids in index order.
     * Returns -1 for bad arguments. */
    int32_t (*sample)(cp_backend *be, const float *logits, int n, float temperature, float top_p, float u);
    /* The annotator's O(T^2) part next to an exported matrix in backend
     * memory (A: T rows, row stride lda; sens: T bytes, backend memory, or
     * NULL): kernels/annot_dev.h.  With it the request path keeps the
     * export where it was computed. */
    cp_status (*annot_open)(cp_backend *be, const float *A, size_t lda, int T, const uint8_t *sens, cp_annot_dev *out,
                            cp_error *err);
    void (*annot_close)(cp_backend *be, cp_annot_dev *d);
    /* The dtype matrices are loaded in from now on (model/ calls it before
     * loading, per the load's dtype option); CP_EUNSUPPORTED for a dtype
     * the backend cannot compute with.  Changing it under a loaded model
     * makes that model's forward passes fail (model/ checks). */
    cp_status (*set_matrix_dtype)(cp_backend *be, cp_dtype dt, cp_error *err);
    /* Optional (NULL where a backend keeps matrices as loaded): copies the
     * matrix W [rows, cols] of the backend's matrix_dtype (bf16 or f32)
     * from host memory into newly allocated backend memory in the layout
     * this backend's GEMMs prefer now (the CPU's oneDNN path:
     * kernels/cpu/gemm_dnnl.h; its avx512bf16 path: gemm_bf16_packed.h;
     * its AVX-512 f32 path: gemm_f32.h's f32p), *bytes its size: *out
     * describes it (its layout the backend's).  out->data stays NULL (CP_OK)
     * where the current path reads W as it is.  A packed matrix serves
     * matmul, free (of its data) and download_matrix; embed only
     * where the backend says it reads packed rows (flags has
     * CP_BE_EMBED_READS_PACKED: the CPU's avx512bf16 and amx paths, so a
     * tied embedding is packed once as the LM head), never elsewhere. */
    cp_status (*pack_matrix)(cp_backend *be, const void *w, int rows, int cols, cp_matrix *out, size_t *bytes, cp_error *err);
    /* Optional (NULL where every matrix is row-major): W's row-major
     * elements (rows x cols of its dtype) into dst_host, whatever its
     * layout.  cp_matrix_download calls it. */
    cp_status (*download_matrix)(cp_backend *be, void *dst_host, const cp_matrix *w, cp_error *err);
    /* Optional (NULL: free of its data): releases a matrix's memory,
     * packed or not.  cp_matrix_free calls it. */
    void (*free_matrix)(cp_backend *be, cp_matrix *w);
    /* One line naming how matmuls run now (benchmarks, logs). */
    const char *(*describe)(cp_backend *be);
};

/* Marks a profiler range when the backend has ranges. */
static inline void cp_range_push(cp_backend *be, const char *name)
{
    if (be->range_push) be->range_push(be, name);
}
static inline void cp_range_pop(cp_backend *be)
{
    if (be->range_pop) be->range_pop(be);
}

/* CPU backend: always available.  Matrices f32 until set_matrix_dtype
 * selects bf16; then matmuls compute in f32 from the bf16 weights, or in
 * bf16 through oneDNN where the CPU has AMX-BF16 (cpuid at creation;
 * CP_CPU_ISA=generic|avx2|avx512|amx in the environment forces a path:
 * kernels/cpu/gemm_bf16.h). */
cp_status cp_backend_cpu_create(cp_backend **out, cp_error *err);
/* One line naming the CPU backend's compute path: its ISA, the weight
 * dtype of its matrices now and their GEMM provider, the OpenBLAS kernel
 * set and OpenMP's wait policy ("compute: amx, bf16 weights -> oneDNN bf16
 * matmul (avx512_core_amx); f32 BLAS: ..."); per_dtype: every dtype's
 * provider instead (no model loaded).  CP_EINVAL for another backend. */
cp_status cp_cpu_compute_line(cp_backend *be, int per_dtype, char *out, size_t cap, cp_error *err);
/* CUDA backend: CP_EUNSUPPORTED when built without CUDA=1, CP_EDEVICE when
 * no device is present.  Weights are bf16 and its GEMMs (cuBLASLt) round
 * activations to bf16; CP_CUDA_GEMM=f32 in the environment at creation
 * selects the exact variant instead: f32 weights (matrix_dtype CP_F32) and
 * plain f32 kernels, for parity checks against the CPU. */
cp_status cp_backend_cuda_create(cp_backend **out, cp_error *err);
/* Informational: number of CUDA devices, 0 when none or built without CUDA. */
int cp_backend_cuda_device_count(void);

/* W's row-major elements to the host: download_matrix for a packed
 * matrix, else a plain download of rows x cols elements of its dtype */
static inline cp_status cp_matrix_download(cp_backend *be, void *dst_host, const cp_matrix *w, cp_error *err)
{
    if (w->layout != CP_LAYOUT_ROWS && be->download_matrix) return be->download_matrix(be, dst_host, w, err);
    if (w->layout != CP_LAYOUT_ROWS) return cp_fail(err, CP_EINVAL, "%s backend: a packed matrix it cannot read back", be->name);
    return be->download(be, dst_host, w->data, (size_t)w->rows * w->cols * cp_dtype_size(w->dtype), err);
}

/* releases w's memory (free_matrix, or free of its data); w empty after */
static inline void cp_matrix_free(cp_backend *be, cp_matrix *w)
{
    if (w->data) {
        if (be->free_matrix) be->free_matrix(be, w);
        else be->free(be, w->data);
    }
    w->data = NULL;
}

static inline void cp_backend_destroy(cp_backend *be)
{
    if (be) be->destroy(be);
}

#endif
