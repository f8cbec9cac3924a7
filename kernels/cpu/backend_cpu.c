/* The CPU backend: host memory and the reference kernels of ops_cpu.c;
 * with bf16 matrices, the GEMMs of gemm_amx.c / gemm_bf16.c / gemm_dnnl.c.  The device
 * check's libc-only build (CP_NO_BLAS) has f32 matrices only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../dtype.h"
#include "ops_cpu.h"
#include "gemm_bf16_packed.h"
#ifndef CP_NO_BLAS
#include "../q8.h"
#include "gemm_bf16.h"
#include "gemm_amx.h"
#include "gemm_dnnl.h"
#include "gemm_f32.h"
#include "gemm_i8.h"
#include "gemm_i8_prefill.h"
#include "attn_dnnl.h"
#include "cpu_runtime.h"
#include <omp.h>
#endif

#ifndef CP_NO_BLAS
/* the layouts pack_matrix makes (cp_matrix.layout; CP_LAYOUT_ROWS is
 * row-major): oneDNN's, bf16p's (gemm_bf16_packed.h), the AMX tiles'
 * (gemm_amx.h: its padding follows from the shape) or, f32 matrices,
 * f32p's (gemm_f32.h) */
enum { PACK_DNNL = 1, PACK_BF16P, PACK_AMX, PACK_F32P };

/* int8 on the amx path: the tile kernel past this many rows, the vnni
 * panel kernels at and below it (the same integers and epilogue: bit-equal) */
#define AMX_I8_MIN_ROWS 16
#endif

typedef struct cpu_impl {
    float *scratch; /* attention scores, grown on demand */
    size_t scratch_floats;
    float *kv_wide; /* a bf16 cache's K and V widened for attention, grown on demand */
    size_t kv_wide_floats;
    /* attention_batch's decode items, their first pairs and scratch
     * offsets (ops_cpu.h, cpu_attention_decode_many), grown on demand */
    cp_attn_args *batch_args;
    int *batch_first;
    size_t *batch_off, batch_cap;
    cp_status sticky;
    char sticky_msg[256];
#ifndef CP_NO_BLAS
    cpu_features feat;
    cpu_isa isa;     /* the bf16 path (gemm_bf16.h) */
    cpu_isa dot_isa; /* the small-batch kernels' ISA (amx: the widest f32 one) */
    q8_isa q8;       /* the int8 kernels' (gemm_i8.h) */
    int bf16p;       /* matrices packed at load into bf16p's layout, run by bf16p_gemm at every n (forced avx512bf16) */
    int amx;          /* the amx path with the tile kernels ready (cp_amx_ready): bf16 and int8 GEMMs on tiles */
    char amx_why[200]; /* the amx path without them: why (cp_amx_ready's message) */
    cp_dnnl_mm *dnnl; /* made when bf16 matrices meet the amx path */
    float *gemm_scratch; /* widened weight blocks, grown on demand */
    size_t gemm_scratch_floats;
    size_t n_packed; /* packed matrices alive (pack_matrix, free_matrix): the describe line counts them */
    cp_dnnl_attn *attn; /* bf16 attention for exports of 16+ rows on the amx path, and on the int8 vnni path (i8_attn) */
    int i8_attn;        /* int8 matrices: exports through attn (the CPU has AVX512_BF16 or AMX-BF16) */
#endif
    char desc[512];
} cpu_impl;

static void cpu_destroy(cp_backend *be)
{
    cpu_impl *im = be->impl;
    free(im->scratch);
    free(im->kv_wide);
    free(im->batch_args), free(im->batch_first), free(im->batch_off);
#ifndef CP_NO_BLAS
    cp_dnnl_attn_destroy(im->attn);
    cp_dnnl_mm_destroy(im->dnnl);
    free(im->gemm_scratch);
#endif
    free(im);
    free(be);
}

/* the first failure of a queued op, reported by the next sync */
static void cpu_stick(cpu_impl *im, cp_status rc, const char *msg)
{
    if (im->sticky != CP_OK) return;
    im->sticky = rc;
    snprintf(im->sticky_msg, sizeof im->sticky_msg, "%.200s", msg);
}

static cp_status cpu_alloc(cp_backend *be, size_t bytes, void **out, cp_error *err)
{
    (void)be;
    /* 64-byte alignment for vector loads; round the size up as C11 demands */
    size_t sz = (bytes + 63) & ~(size_t)63;
    *out = aligned_alloc(64, sz ? sz : 64);
    if (!*out) return cp_fail(err, CP_ENOMEM, "cpu backend: out of memory allocating %zu bytes", bytes);
    return CP_OK;
}

static void cpu_free(cp_backend *be, void *p)
{
    (void)be;
    free(p);
}

static cp_status cpu_upload(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    (void)be, (void)err;
    memcpy(dst, src, bytes);
    return CP_OK;
}

static cp_status cpu_download(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    return cpu_upload(be, dst, src, bytes, err);
}

#ifndef CP_NO_BLAS
/* the AMX tiles' layout of a packed [rows, cols] matrix (its padding
 * follows from the shape); 0 when the shape has none (recorded) */
static int amx_layout(cpu_impl *im, const cp_matrix *w, cp_amx_bf16_layout *L)
{
    cp_error e = { 0 };
    if (cp_amx_bf16_layout_of(w->rows, w->cols, L, &e) == CP_OK) return 1;
    cpu_stick(im, e.code, e.msg);
    return 0;
}

/* a packed matrix back row-major, as it was given */
static cp_status cpu_download_matrix(cp_backend *be, void *dst, const cp_matrix *w, cp_error *err)
{
    cpu_impl *im = be->impl;
    const size_t esz = cp_dtype_size(w->dtype);
    if (w->layout == CP_LAYOUT_ROWS) return cpu_upload(be, dst, w->data, (size_t)w->rows * w->cols * esz, err);
    if (w->layout == PACK_F32P) {
        f32p_unpack(dst, w->data, w->rows, w->cols);
        return CP_OK;
    }
    if (w->layout == PACK_BF16P) {
        bf16p_unpack(dst, w->data, w->rows, w->cols);
        return CP_OK;
    }
    if (w->layout == PACK_AMX) {
        cp_amx_bf16_layout L;
        if (cp_amx_bf16_layout_of(w->rows, w->cols, &L, err)) return cp_fail_wrap(err, "cpu backend: downloading a packed matrix");
        cp_amx_bf16_unpack(dst, w->data, &L);
        return CP_OK;
    }
    if (w->layout == PACK_DNNL) return cp_dnnl_mm_unpack(im->dnnl, dst, w->data, w->cols, w->rows, err);
    return cp_fail(err, CP_EINVAL, "cpu backend: a [%d x %d] matrix in a layout (%d) it never made", w->rows, w->cols, w->layout);
}

/* a matrix's memory; a packed one leaves the describe line's count */
static void cpu_free_matrix(cp_backend *be, cp_matrix *w)
{
    cpu_impl *im = be->impl;
    if (w->layout != CP_LAYOUT_ROWS && im->n_packed) im->n_packed--;
    free(w->data);
}
#endif

static void cpu_copy(cp_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memmove(dst, src, bytes);
}

static void cpu_zero(cp_backend *be, void *dst, size_t bytes)
{
    (void)be;
    memset(dst, 0, bytes);
}

static cp_status cpu_sync(cp_backend *be, cp_error *err)
{
    cpu_impl *im = be->impl;
    cp_status rc = im->sticky;
    if (rc != CP_OK) cp_fail(err, rc, "cpu backend: %s", im->sticky_msg);
    im->sticky = CP_OK;
    return rc;
}

static void cpu_embed_op(cp_backend *be, float *out, const cp_matrix *table, const int32_t *ids, int n, int dim)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    if (table->layout != CP_LAYOUT_ROWS) { /* a tied table packed as the LM head (CP_BE_EMBED_READS_PACKED) */
        cp_amx_bf16_layout L;
        if (be->matrix_dtype != CP_BF16 || (table->layout != PACK_AMX && table->layout != PACK_BF16P) || table->cols != dim)
            cpu_stick(im, CP_EINVAL, "embed: a packed table this path cannot read by rows");
        else if (table->layout == PACK_AMX) {
            if (amx_layout(im, table, &L)) cp_amx_bf16_rows(out, table->data, &L, ids, n);
        } else bf16p_rows(out, table->data, ids, n, table->rows, dim);
        return;
    }
#endif
    if (be->matrix_dtype == CP_BF16) cpu_embed_bf16(out, table->data, ids, n, dim);
#ifndef CP_NO_BLAS
    else if (be->matrix_dtype == CP_I8) q8_embed(out, table->data, ids, n, dim);
#endif
    else cpu_embed(out, table->data, ids, n, dim);
}

static void cpu_rmsnorm_op(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    if (be->matrix_dtype == CP_I8 && q8p_takes(im->q8, Q8P_MIN_ROWS + 1)) { /* the fused int8 prefill's own norm, at every n */
        if ((long)n * dim > CPU_SERIAL_ELEMS) q8p_rmsnorm(out, x, w, n, dim, eps);
        else /* a few rows: on this thread (ops_cpu.h, CPU_SERIAL_ELEMS), q8p_rmsnorm's rows */
            for (int i = 0; i < n; i++) q8p_rmsnorm_row(out + (size_t)i * dim, x + (size_t)i * dim, w, dim, eps);
        return;
    }
#else
    (void)be;
#endif
    cpu_rmsnorm(out, x, w, n, dim, eps);
}

#ifndef CP_NO_BLAS
/* grows the GEMM scratch to `bytes`; 0 when out of memory (recorded,
 * naming `what` the scratch was for) */
static int gemm_scratch_reserve(cpu_impl *im, size_t bytes, const char *what)
{
    size_t need = (bytes + sizeof(float) - 1) / sizeof(float);
    if (need <= im->gemm_scratch_floats) return 1;
    free(im->gemm_scratch);
    im->gemm_scratch_floats = 0;
    if (!(im->gemm_scratch = aligned_alloc(64, (need * sizeof(float) + 63) & ~(size_t)63))) {
        char msg[128];
        snprintf(msg, sizeof msg, "out of memory for %s", what);
        cpu_stick(im, CP_ENOMEM, msg);
        return 0;
    }
    im->gemm_scratch_floats = need;
    return 1;
}

/* y = (accumulate ? y : 0) + x . W^T over bf16 W: the path chosen at
 * creation (gemm_bf16.h) */
static void matmul_bf16(cpu_impl *im, float *y, int ldy, const float *x, const cp_matrix *wm, int n, int in, int out,
                        int accumulate)
{
    const uint16_t *w = wm->data;
    if (wm->layout != CP_LAYOUT_ROWS) { /* packed: its layout's one kernel at every n (the AMX tiles', oneDNN's or bf16p's: batch-invariant) */
        cp_error e = { 0 };
        cp_amx_bf16_layout L;
        if (wm->rows != out || wm->cols != in) cpu_stick(im, CP_EINVAL, "bf16 matmul: a packed weight of another shape than asked for");
        else if (wm->layout == PACK_AMX) {
            int threads = omp_get_max_threads();
            if (amx_layout(im, wm, &L) && gemm_scratch_reserve(im, cp_amx_bf16_scratch(n, &L, threads), "the AMX bf16 GEMM's staged rows") &&
                cp_amx_bf16_gemm(y, ldy, x, w, &L, n, accumulate, im->gemm_scratch, threads, &e))
                cpu_stick(im, e.code, e.msg);
        } else if (wm->layout == PACK_BF16P) {
            if (gemm_scratch_reserve(im, bf16p_scratch(n, in), "the packed bf16 GEMM's rounded rows"))
                bf16p_gemm(y, ldy, x, w, n, in, out, accumulate, im->gemm_scratch);
        } else if (wm->layout != PACK_DNNL) cpu_stick(im, CP_EINVAL, "bf16 matmul: a weight in a layout this path never made");
        else if (cp_dnnl_mm_run_packed(im->dnnl, y, ldy, x, w, n, in, out, accumulate, &e)) cpu_stick(im, e.code, e.msg);
        return;
    }
    if (im->bf16p) { /* plain on the bf16p path (the tied embedding as the LM head: embed reads its rows): the same bits */
        if (gemm_scratch_reserve(im, bf16p_plain_scratch(n, in), "the bf16 GEMM's rounded rows"))
            bf16p_gemm_plain(y, ldy, x, w, n, in, out, accumulate, im->gemm_scratch);
        return;
    }
    /* batch invariance: one kernel at every n on each path -- oneDNN's
     * fixed row blocks on amx (gemm_dnnl.h; with the tiles ready only
     * matrices packed outside the loader are plain), the dot kernels elsewhere
     * (gemm_bf16.h: the same operations for a row whatever n); sgemm on
     * widened blocks and the vdpbf16ps kernel each give a row other bits
     * than the kernel beside them, so neither serves */
    if (im->isa == CPU_ISA_AMX) {
        cp_error e = { 0 };
        if (cp_dnnl_mm_run(im->dnnl, y, ldy, x, w, n, in, out, accumulate, &e)) cpu_stick(im, e.code, e.msg);
        return;
    }
    bf16_gemm_small(im->dot_isa, y, ldy, x, w, n, in, out, accumulate);
}

/* y = (accumulate ? y : 0) + x . W^T over a q8 blob W (kernels/q8.h) */
static void matmul_i8(cpu_impl *im, float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate)
{ /* w: a q8 blob, whose header names its order */
    if (!cp_q8_matches(w, out, in)) {
        cpu_stick(im, CP_EINVAL, "int8 matmul: the weight is not an int8 matrix of the shape asked for");
        return;
    }
    if (cp_q8_layout(w) == CP_Q8_PANELS && im->q8 != Q8_VNNI) { /* only the vnni kernel reads the panel order */
        cpu_stick(im, CP_EINVAL, "int8 matmul: a weight packed in the vnni panel order on a path without the vnni kernel");
        return;
    }
    if (im->amx && n > AMX_I8_MIN_ROWS && cp_q8_layout(w) == CP_Q8_PANELS) { /* the tile kernel: the vnni kernels' integers and epilogue */
        int threads = (long)out * in > 65536 ? omp_get_max_threads() : 1;
        cp_error e = { 0 };
        if (gemm_scratch_reserve(im, cp_amx_i8_scratch(n, in, threads), "the AMX int8 GEMM's scratch") &&
            cp_amx_i8_gemm(y, ldy, x, w, n, in, out, accumulate, im->gemm_scratch, threads, &e))
            cpu_stick(im, e.code, e.msg);
        return;
    }
    if (q8p_takes_w(im->q8, n, w)) { /* packed at load (every n), or prefill-sized: the register-blocked VNNI kernel, the same integers */
        int threads = (long)out * in > 65536 ? omp_get_max_threads() : 1; /* a small matrix on one thread, as q8_gemm's */
        if (gemm_scratch_reserve(im, q8p_scratch(n, in, threads), "the int8 prefill GEMM's scratch"))
            q8p_gemm(y, ldy, x, w, n, in, out, accumulate, im->gemm_scratch, threads);
        return;
    }
    if (gemm_scratch_reserve(im, q8_scratch(n, in), "the GEMM's scratch")) q8_gemm(im->q8, y, ldy, x, w, n, in, out, accumulate, im->gemm_scratch);
}
#endif

#ifndef CP_NO_BLAS
/* q8p_run over outs from src, when the register-blocked kernel takes every
 * weight at n rows (packed at load: every n; row-major: past
 * Q8P_MIN_ROWS): 0 when it does not (the caller runs the plain ops) */
static int fused_i8(cpu_impl *im, const q8p_src *src, const q8p_out *o, int count, int n, int in)
{
    for (int j = 0; j < count; j++)
        if (!cp_q8_matches(o[j].w, o[j].out, in)) {
            cpu_stick(im, CP_EINVAL, "fused int8 matmul: a weight is not an int8 matrix of the shape asked for");
            return 1;
        }
    if (im->amx && n > AMX_I8_MIN_ROWS) return 0; /* the plain ops: the norm or SwiGLU the fused kernel computes, then the tiles */
    for (int j = 0; j < count; j++) /* one row-major weight at a decode size: the plain ops (its dot kernels) */
        if (!q8p_takes_w(im->q8, n, o[j].w)) return 0;
    long work = 0;
    for (int j = 0; j < count; j++) work += (long)o[j].out * in;
    int threads = work > 65536 ? omp_get_max_threads() : 1; /* small products on one thread, as q8_gemm's */
    if (gemm_scratch_reserve(im, q8p_scratch(n, in, threads), "the int8 prefill GEMM's scratch"))
        q8p_run(src, o, count, n, in, im->gemm_scratch, threads);
    return 1;
}
#endif

static int cpu_norm_matmuls_op(cp_backend *be, const float *x, const float *norm_w, float eps, int n, int in, const cp_mm_out *outs,
                               int count)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    if (be->matrix_dtype != CP_I8 || im->q8 != Q8_VNNI || count < 1 || count > Q8P_MAX_OUTS) return 0;
    q8p_out o[Q8P_MAX_OUTS];
    for (int j = 0; j < count; j++) o[j] = (q8p_out){ outs[j].y, outs[j].ldy, outs[j].w->data, outs[j].bias, outs[j].out, 0 };
    const q8p_src src = { .kind = Q8P_SRC_NORM, .x = x, .norm_w = norm_w, .eps = eps };
    return fused_i8(im, &src, o, count, n, in);
#else
    (void)be, (void)x, (void)norm_w, (void)eps, (void)n, (void)in, (void)outs, (void)count;
    return 0;
#endif
}

#ifndef CP_NO_BLAS
/* y = (accumulate ? y : 0) + x . W^T over f32 W, not OpenBLAS: packed
 * at load (AVX-512), f32p's register-blocked kernel at every n; plain (the
 * tied LM head, or other paths), the dot kernels at every n -- each
 * batch-invariant (gemm_f32.h) */
static void matmul_f32(cpu_impl *im, float *y, int ldy, const float *x, const cp_matrix *wm, int n, int in, int out, int accumulate)
{
    const float *w = wm->data;
    if (wm->layout == CP_LAYOUT_ROWS) f32_gemm_dot(im->dot_isa, y, ldy, x, w, n, in, out, accumulate);
    else if (wm->layout != PACK_F32P) cpu_stick(im, CP_EINVAL, "f32 matmul: a weight in a layout this path never made");
    else if (wm->rows != out || wm->cols != in) cpu_stick(im, CP_EINVAL, "f32 matmul: a packed weight of another shape than asked for");
    else f32p_gemm(y, ldy, x, w, n, in, out, accumulate);
}
#endif

static int cpu_swiglu_matmul_op(cp_backend *be, float *y, int ldy, const float *gate, const float *up, const cp_matrix *w, int n, int in,
                                int out, int accumulate)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    if (be->matrix_dtype != CP_I8 || im->q8 != Q8_VNNI) return 0;
    const q8p_out o = { y, ldy, w->data, NULL, out, accumulate };
    const q8p_src src = { .kind = Q8P_SRC_SWIGLU, .x = gate, .up = up };
    return fused_i8(im, &src, &o, 1, n, in);
#else
    (void)be, (void)y, (void)ldy, (void)gate, (void)up, (void)w, (void)n, (void)in, (void)out, (void)accumulate;
    return 0;
#endif
}

static void cpu_matmul_op(cp_backend *be, float *y, int ldy, const float *x, const cp_matrix *w, const float *bias, int n,
                          int in, int out, int accumulate)
{
#ifndef CP_NO_BLAS
    if (be->matrix_dtype == CP_BF16) matmul_bf16(be->impl, y, ldy, x, w, n, in, out, accumulate);
    else if (be->matrix_dtype == CP_I8) matmul_i8(be->impl, y, ldy, x, w->data, n, in, out, accumulate);
    else matmul_f32(be->impl, y, ldy, x, w, n, in, out, accumulate);
    if (bias) cpu_add_bias(y, ldy, bias, n, out);
#else
    (void)be;
    cpu_matmul(y, ldy, x, w->data, bias, n, in, out, accumulate);
#endif
}

static void cpu_rope_op(cp_backend *be, float *x, int ld, const float *cos, const float *sin, int n, int n_heads,
                        int head_dim)
{
    (void)be;
    cpu_rope(x, ld, cos, sin, n, n_heads, head_dim);
}

#ifndef CP_NO_BLAS
/* whether attention(a) goes to oneDNN's bf16 attention: prefill on the
 * bf16-compute path, its matmuls in bf16 too */
static int cpu_attention_dnnl(const cp_backend *be, const cp_attn_args *a)
{
    const cpu_impl *im = be->impl;
    int i8 = be->matrix_dtype == CP_I8 && im->i8_attn; /* attn_dnnl reads an f32 or a bf16 cache */
    return im->attn && (be->matrix_dtype == CP_BF16 || i8) && a->n >= CP_DNNL_ATTN_MIN_N;
}
#endif

/* grows im->scratch to `need` floats; 0 when out of memory (recorded) */
static int attn_scratch_reserve(cpu_impl *im, size_t need)
{
    if (need <= im->scratch_floats) return 1;
    float *s = realloc(im->scratch, need * sizeof(float));
    if (!s) {
        cpu_stick(im, CP_ENOMEM, "out of memory for attention scores");
        return 0;
    }
    im->scratch = s;
    im->scratch_floats = need;
    return 1;
}

/* attention(a) by the general kernels: oneDNN's bf16 products, the
 * decode kernel, or the BLAS ones (cpu_attention) -- what an export or a
 * sensitive mass is computed by (cpu_attention_op) */
static void attention_general_op(cp_backend *be, const cp_attn_args *a)
{
    cpu_impl *im = be->impl;
#ifndef CP_NO_BLAS
    if (cpu_attention_dnnl(be, a)) {
        cp_error e = { 0 };
        if (cp_dnnl_attention(im->attn, a, &e)) cpu_stick(im, e.code, e.msg);
        return;
    }
#endif
    /* decode over a bf16 cache: read in place (the widened copy would be
     * the step's largest traffic after the weights) */
    const int direct = a->k16 && cpu_attention_decode_fits(a);
    size_t need = direct ? cpu_attention_kv16_scratch_floats(a) : cpu_attention_scratch_floats(a);
    if (!attn_scratch_reserve(im, need)) return;
    if (direct) {
        cpu_attention_kv16(a, im->scratch);
        return;
    }
    if (!a->k16) {
        cpu_attention(a, im->scratch);
        return;
    }
    /* bf16 KV, a prefill (or an export): the keys' K and V widened once
     * per call (exact), then the f32 attention's BLAS products, whose work
     * (n rows a key) outweighs the copy */
    const size_t row = (size_t)a->n_kv_heads * a->head_dim, wide = 2 * (size_t)a->n_keys * row;
    if (wide > im->kv_wide_floats) {
        float *w = realloc(im->kv_wide, wide * sizeof(float));
        if (!w) {
            cpu_stick(im, CP_ENOMEM, "out of memory widening a bf16 KV cache");
            return;
        }
        im->kv_wide = w;
        im->kv_wide_floats = wide;
    }
    float *kf = im->kv_wide, *vf = kf + (size_t)a->n_keys * row;
    cp_convert_float(kf, CP_F32, a->k16, CP_BF16, (size_t)a->n_keys * row);
    if (a->out) cp_convert_float(vf, CP_F32, a->v16, CP_BF16, (size_t)a->n_keys * row); /* no output rows: V is never read */
    cp_attn_args b = *a;
    b.k = kf, b.v = vf, b.k16 = b.v16 = NULL;
    cpu_attention(&b, im->scratch);
}

/* Batch invariance: every row's output comes from the pair kernel
 * (ops_cpu.h, cpu_attention_rows), at every row count, on every path --
 * oneDNN's bf16 attention and the BLAS products reduce over blocks whose
 * edges move with the chunk's rows and keys, so a row's output there
 * depends on what it was computed with.  An export or a sensitive mass
 * (a cacheprune scoring prefill) still comes from the general kernels,
 * called with no output rows (out NULL: their QK^T and softmax only,
 * no PV product).  The libc-only build keeps its double-precision
 * reference, which is per row too. */
static void cpu_attention_op(cp_backend *be, const cp_attn_args *a)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    if (a->export_a || a->sens_mass) {
        cp_attn_args g = *a;
        g.out = NULL; /* the export and the mass only: no PV product */
        attention_general_op(be, &g);
    }
    if (!a->out) return; /* an export-only call (CP_BE_ATTN_EXPORT_ONLY) */
    cp_attn_args r = *a;
    r.export_a = NULL, r.sens_cols = NULL, r.sens_mass = NULL;
    const int threads = omp_get_max_threads();
    if (!attn_scratch_reserve(im, cpu_attention_rows_scratch_floats(&r, threads))) return;
    cpu_attention_rows(&r, im->scratch, threads);
#else
    attention_general_op(be, a);
#endif
}

/* the batch tables hold `count` decode items; 0 when out of memory (recorded) */
static int batch_reserve(cpu_impl *im, size_t count)
{
    if (count <= im->batch_cap) return 1;
    cp_attn_args *a = realloc(im->batch_args, count * sizeof *a);
    if (a) im->batch_args = a;
    int *f = a ? realloc(im->batch_first, (count + 1) * sizeof *f) : NULL;
    if (f) im->batch_first = f;
    size_t *o = f ? realloc(im->batch_off, count * sizeof *o) : NULL;
    if (!o) {
        cpu_stick(im, CP_ENOMEM, "out of memory for a batched attention's tables");
        return 0;
    }
    im->batch_off = o;
    im->batch_cap = count;
    return 1;
}

/* whether attention(a) runs the decode kernel (cpu_attention_decode): f32
 * or a bf16 cache read in place, not oneDNN's; the libc-only build's f32
 * attention is its double-precision reference at every n */
static int cpu_attention_decodes(const cp_backend *be, const cp_attn_args *a)
{
#ifdef CP_NO_BLAS
    (void)be;
    return a->k16 && cpu_attention_decode_fits(a);
#else
    return !cpu_attention_dnnl(be, a) && cpu_attention_decode_fits(a);
#endif
}

/* Every item that attention() would send to the decode kernel runs
 * in one parallel region over all their (row, KV head) pairs; the rest
 * (prefill chunks, exports) through attention() one by one, after it (they
 * share the scratch). */
static void cpu_attention_batch_op(cp_backend *be, const cp_attn_args *a, int count)
{
    cpu_impl *im = be->impl;
    if (count < 1) return;
    if (!batch_reserve(im, (size_t)count)) return;
    int nd = 0;
    for (int c = 0; c < count; c++)
        if (cpu_attention_decodes(be, &a[c])) im->batch_args[nd++] = a[c];
    if (nd > 0) {
        size_t need = cpu_attention_decode_many_plan(im->batch_args, nd, im->batch_first, im->batch_off);
        if (!attn_scratch_reserve(im, need)) return;
        cpu_attention_decode_many(im->batch_args, nd, im->batch_first, im->batch_off, im->scratch, CPU_ATTN_AUTO);
    }
    for (int c = 0; c < count; c++)
        if (!cpu_attention_decodes(be, &a[c])) cpu_attention_op(be, &a[c]);
}

static void cpu_kv_store_bf16_op(cp_backend *be, uint16_t *dst, float *src, size_t count)
{
    (void)be;
    cpu_kv_store_bf16(dst, src, count);
}

static void cpu_place_kv_bf16_op(cp_backend *be, uint16_t *k, uint16_t *k_pre, uint16_t *v, const uint16_t *src_k, const uint16_t *src_v,
                                 size_t src_ld, int n, const float *cos, const float *sin, int n_kv_heads, int head_dim)
{
    (void)be;
    cpu_place_kv_bf16(k, k_pre, v, src_k, src_v, src_ld, n, cos, sin, n_kv_heads, head_dim);
}

static void cpu_swiglu_op(cp_backend *be, float *out, const float *gate, const float *up, size_t count)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    if (be->matrix_dtype == CP_I8 && q8p_takes(im->q8, Q8P_MIN_ROWS + 1)) { /* int8 is approximate already: the vector exp */
        if (count > (size_t)CPU_SERIAL_ELEMS) q8p_swiglu(out, gate, up, count);
        else q8p_swiglu_span(out, gate, up, count); /* on this thread: q8p_swiglu's lanes */
        return;
    }
#else
    (void)be;
#endif
    cpu_swiglu(out, gate, up, count);
}

static void cpu_place_kv_op(cp_backend *be, float *k, float *k_pre, float *v, const float *src_k, const float *src_v, size_t src_ld,
                            int n, const float *cos, const float *sin, int n_kv_heads, int head_dim)
{
    (void)be;
    cpu_place_kv(k, k_pre, v, src_k, src_v, src_ld, n, cos, sin, n_kv_heads, head_dim);
}

static int32_t cpu_sample_op(cp_backend *be, const float *logits, int n, float temperature, float top_p, float u)
{
    (void)be;
    return cpu_sample(logits, n, temperature, top_p, u);
}

#ifndef CP_NO_BLAS
/* int8 on the vnni prefill path: an exporting prefill's attention (the
 * export and the sensitive mass; its output rows are the pair kernel's,
 * cpu_attention_op) in bf16 through oneDNN where the CPU computes bf16
 * natively (AVX512_BF16 / AMX-BF16; without them oneDNN 2.6 has no fast
 * bf16).  Where oneDNN cannot make its engine the f32 export stays: a
 * slower export, never a failed load. */
static void i8_attention(cpu_impl *im)
{
    im->i8_attn = 0;
    if (!q8p_takes(im->q8, Q8P_MIN_ROWS + 1) || !(im->feat.avx512_bf16 || im->feat.amx_bf16)) return;
    cp_error e = { 0 };
    if (!im->dnnl && cp_dnnl_mm_create(&im->dnnl, &e)) return;
    if (!im->attn && cp_dnnl_attn_create(&im->attn, im->dnnl, &e)) return;
    im->i8_attn = 1;
}
#endif

static cp_status set_matrix_dtype(cp_backend *be, cp_dtype dt, cp_error *err)
{
    if (dt == CP_F32) return be->matrix_dtype = dt, CP_OK;
#ifdef CP_NO_BLAS
    return cp_fail(err, CP_EUNSUPPORTED, "cpu backend: this build (no BLAS) keeps matrices in f32, not %s", cp_dtype_name(dt));
#else
    cpu_impl *im = be->impl;
    if (dt == CP_I8) {
        i8_attention(im);
        be->matrix_dtype = dt;
        return CP_OK;
    }
    if (dt != CP_BF16)
        return cp_fail(err, CP_EUNSUPPORTED, "cpu backend: matrices can be F32, BF16 or I8, not %s", cp_dtype_name(dt));
    if (im->isa == CPU_ISA_AMX && !im->dnnl) {
        cp_status rc = cp_dnnl_mm_create(&im->dnnl, err);
        if (rc) return rc;
    }
    if (im->isa == CPU_ISA_AMX && !im->attn) {
        cp_status rc = cp_dnnl_attn_create(&im->attn, im->dnnl, err);
        if (rc) return rc;
    }
    be->matrix_dtype = dt;
    return CP_OK;
#endif
}

#ifndef CP_NO_BLAS
/* bf16 W in the AMX tiles' layout on the amx path (oneDNN's where
 * cp_amx_ready failed), in bf16p's on the avx512bf16 one, f32 W in f32p's
 * where the f32 kernels are AVX-512 (backend.h), named in the handle's layout;
 * plain (NULL) on every other path */
static cp_status cpu_pack_matrix(cp_backend *be, const void *w, int rows, int cols, cp_matrix *out, size_t *bytes, cp_error *err)
{
    cpu_impl *im = be->impl;
    *out = (cp_matrix){ 0 }, *bytes = 0;
    const int f32p = be->matrix_dtype == CP_F32 && f32p_takes(im->dot_isa);
    if (!f32p && (be->matrix_dtype != CP_BF16 || (im->isa != CPU_ISA_AMX && !im->bf16p))) return CP_OK;
    if (rows < 1 || cols < 1) return cp_fail(err, CP_EINVAL, "cpu backend: packing a [%d x %d] matrix: empty", rows, cols);
    cp_amx_bf16_layout L = { 0 };
    if (!f32p && im->amx && cp_amx_bf16_layout_of(rows, cols, &L, err)) return cp_fail_wrap(err, "cpu backend: packing a [%d x %d] matrix", rows, cols);
    const int kind = f32p ? PACK_F32P : im->amx ? PACK_AMX : im->bf16p ? PACK_BF16P : PACK_DNNL;
    size_t b = kind == PACK_F32P ? f32p_bytes(rows, cols)
               : kind == PACK_AMX ? L.bytes
               : kind == PACK_BF16P ? bf16p_bytes(rows, cols)
                                    : cp_dnnl_mm_packed_bytes(im->dnnl, cols, rows, err);
    if (!b) return cp_fail_wrap(err, "cpu backend: packing a [%d x %d] matrix", rows, cols);
    void *p;
    cp_status rc = cpu_alloc(be, b, &p, err);
    if (rc) return rc;
    if (kind == PACK_F32P) f32p_pack(p, w, rows, cols);
    else if (kind == PACK_AMX) cp_amx_bf16_pack_into(p, w, &L);
    else if (kind == PACK_BF16P) bf16p_pack(p, w, rows, cols);
    else if ((rc = cp_dnnl_mm_pack(im->dnnl, p, b, w, cols, rows, err))) {
        free(p);
        return rc;
    }
    im->n_packed++;
    *out = (cp_matrix){ p, be->matrix_dtype, rows, cols, kind }, *bytes = b;
    return CP_OK;
}
#endif

static unsigned cpu_flags(const cp_backend *be);

/* the dtype, and the flags that follow from it */
static cp_status cpu_set_matrix_dtype(cp_backend *be, cp_dtype dt, cp_error *err)
{
    cp_status rc = set_matrix_dtype(be, dt, err);
    be->flags = cpu_flags(be);
    return rc;
}

static const char *cpu_describe(cp_backend *be)
{
    cpu_impl *im = be->impl;
#ifndef CP_NO_BLAS
    if (be->matrix_dtype == CP_BF16) {
        if (im->amx)
            snprintf(im->desc, sizeof im->desc,
                     "bf16 weights, bf16 compute: AMX tile kernels (_tile_dpbf16ps) at every n on %zu matrices packed at load in tile "
                     "order, batch-invariant (activations rounded to bf16); plain matrices: oneDNN matmul (impl %s); f32 attention",
                     im->n_packed, *cp_dnnl_mm_last_impl(im->dnnl) ? cp_dnnl_mm_last_impl(im->dnnl) : "none yet");
        else if (im->isa == CPU_ISA_AMX)
            snprintf(im->desc, sizeof im->desc,
                     "bf16 weights, bf16 compute: oneDNN matmul (isa %s, impl %s) in fixed blocks of %d rows at every n, %zu matrices "
                     "packed at load, batch-invariant (%.100s); f32 attention",
                     cp_dnnl_mm_isa(), *cp_dnnl_mm_last_impl(im->dnnl) ? cp_dnnl_mm_last_impl(im->dnnl) : "none yet", CP_DNNL_ROWS,
                     im->n_packed, im->amx_why);
        else if (im->bf16p)
            snprintf(im->desc, sizeof im->desc,
                     "bf16 weights, bf16 compute: avx512bf16 vdpbf16ps, register-blocked on %zu matrices packed at load (bf16p), "
                     "rows-in-lanes on plain ones (the same bits), at every n, batch-invariant (activations rounded to bf16); f32 attention",
                     im->n_packed);
        else
            snprintf(im->desc, sizeof im->desc, "bf16 weights, f32 compute: %s dot kernels at every n, batch-invariant",
                     cpu_isa_name(im->isa));
        return im->desc;
    }
    if (be->matrix_dtype == CP_I8 && im->q8 == Q8_VNNI && im->amx) {
        snprintf(im->desc, sizeof im->desc,
                 "int8 weights (per-channel scales), packed at load in the vnni panel order: AMX tile kernel (_tile_dpbusd) for n > %d, "
                 "the register-blocked avx512vnni kernel at and below (the same integers: bit-equal; row-major matrices: "
                 "integer dot kernels for n <= %d, the vnni prefill kernel past); attention in f32%s",
                 AMX_I8_MIN_ROWS, Q8P_MIN_ROWS, im->i8_attn ? " (exports in bf16, oneDNN)" : "");
        return im->desc;
    }
    if (be->matrix_dtype == CP_I8 && im->q8 == Q8_VNNI) {
        snprintf(im->desc, sizeof im->desc,
                 "int8 weights (per-channel scales), packed at load in the vnni panel order: the register-blocked avx512vnni kernel "
                 "at every n (row-major matrices: integer dot kernels for n <= %d, the vnni prefill kernel past); attention in f32%s",
                 Q8P_MIN_ROWS, im->i8_attn ? " (exports in bf16, oneDNN)" : "");
        return im->desc;
    }
    if (be->matrix_dtype == CP_I8) {
        snprintf(im->desc, sizeof im->desc,
                 "int8 weights (per-channel scales): %s integer dot kernels, activations quantized per row, %s %d%s; attention in f32%s",
                 q8_isa_name(im->q8), q8p_takes(im->q8, Q8P_MIN_ROWS + 1) ? "n >" : "every batch size, past", Q8P_MIN_ROWS,
                 q8p_takes(im->q8, Q8P_MIN_ROWS + 1) ? ": the register-blocked vnni prefill kernel" : " rows too",
                 im->i8_attn ? " (exports in bf16, oneDNN)" : "");
        return im->desc;
    }
#endif
#ifndef CP_NO_BLAS
    if (f32p_takes(im->dot_isa))
        snprintf(im->desc, sizeof im->desc,
                 "f32 weights, f32 compute: %s register-blocked on %zu matrices packed at load (f32p), dot kernels on plain ones, at "
                 "every n, batch-invariant; f32 attention",
                 cpu_isa_name(im->dot_isa), im->n_packed);
    else
        snprintf(im->desc, sizeof im->desc, "f32 weights, f32 compute: %s dot kernels at every n, batch-invariant; f32 attention",
                 cpu_isa_name(im->dot_isa));
#else
    snprintf(im->desc, sizeof im->desc, "f32 weights, f32 compute: double-precision reference loops");
#endif
    return im->desc;
}

/* the bf16 path: cpuid, or CP_CPU_ISA */
static cp_status cpu_choose_isa(cpu_impl *im, cp_error *err)
{
#ifdef CP_NO_BLAS
    (void)im, (void)err;
    return CP_OK;
#else
    cpu_features_detect(&im->feat);
    const char *forced = getenv("CP_CPU_ISA");
    cp_status rc = cpu_isa_choose(forced, &im->feat, 1, &im->isa, err);
    if (rc) return cp_fail_wrap(err, "cpu backend");
    im->q8 = q8_isa_for(im->isa, forced && *forced, &im->feat);
    im->bf16p = im->isa == CPU_ISA_AVX512_BF16;
    cp_error e = { 0 }; /* the amx path: the tile kernels, or oneDNN and the vnni kernels where this process cannot run them */
    im->amx = im->isa == CPU_ISA_AMX && cp_amx_ready(&e) == CP_OK;
    if (im->isa == CPU_ISA_AMX && !im->amx) snprintf(im->amx_why, sizeof im->amx_why, "%.190s", e.msg);
    im->dot_isa = im->isa == CPU_ISA_AVX512_VNNI || im->isa == CPU_ISA_AVX512_BF16 ? CPU_ISA_AVX512
                  : im->isa != CPU_ISA_AMX ? im->isa
                  : im->feat.avx512 ? CPU_ISA_AVX512
                  : im->feat.avx2_fma ? CPU_ISA_AVX2
                                      : CPU_ISA_GENERIC;
    return CP_OK;
#endif
}

#ifndef CP_NO_BLAS
/* who runs bf16 or int8 matmuls on this path: the branches of matmul_bf16
 * and matmul_i8, by their main provider */
static void gemm_provider(const cpu_impl *im, cp_dtype dt, char *out, size_t cap)
{
    if (dt == CP_BF16 && im->amx) snprintf(out, cap, "own AMX bf16 tile kernels (packed at load)");
    else if (dt == CP_BF16 && im->isa == CPU_ISA_AMX)
        snprintf(out, cap, "oneDNN bf16 matmul (%s) in fixed 16-row blocks (%.100s)", cp_dnnl_mm_isa(), im->amx_why);
    else if (dt == CP_BF16 && im->bf16p) snprintf(out, cap, "own avx512bf16 kernels, bf16 compute (packed at load)");
    else if (dt == CP_BF16) snprintf(out, cap, "own %s kernels, f32 compute", cpu_isa_name(im->dot_isa));
    else if (dt == CP_F32) snprintf(out, cap, "own %s f32 kernels%s", cpu_isa_name(im->dot_isa), f32p_takes(im->dot_isa) ? " (packed at load)" : "");
    else if (im->amx && im->q8 == Q8_VNNI) snprintf(out, cap, "own AMX int8 tile kernels past %d rows, vnni at and below (packed at load)", AMX_I8_MIN_ROWS);
    else snprintf(out, cap, "own %s int8 kernels%s%s%.100s", q8_isa_name(im->q8), im->q8 == Q8_VNNI ? " (packed at load)" : "",
                  im->isa == CPU_ISA_AMX ? "; no AMX tiles: " : "", im->isa == CPU_ISA_AMX ? im->amx_why : "");
}
#endif

cp_status cp_cpu_compute_line(cp_backend *be, int per_dtype, char *out, size_t cap, cp_error *err)
{
    if (!be || be->destroy != cpu_destroy) return cp_fail(err, CP_EINVAL, "compute line: not a CPU backend");
#ifdef CP_NO_BLAS
    (void)per_dtype;
    snprintf(out, cap, "compute: generic, f32 weights -> own f32 kernels (a build without BLAS)");
#else
    const cpu_impl *im = be->impl;
    char blas[160], waits[160], f32[96], bf16[256], i8[256];
    cpu_runtime_blas(blas, sizeof blas);
    cpu_runtime_waits(waits, sizeof waits);
    gemm_provider(im, CP_F32, f32, sizeof f32);
    gemm_provider(im, CP_BF16, bf16, sizeof bf16);
    gemm_provider(im, CP_I8, i8, sizeof i8);
    const char *isa = cpu_isa_name(im->isa);
    cp_dtype dt = be->matrix_dtype;
    if (per_dtype)
        snprintf(out, cap, "compute: %s; f32 weights -> %s; bf16 -> %s; int8 -> %s; BLAS (the export's attention): OpenBLAS %s; OpenMP waits: %s",
                 isa, f32, bf16, i8, blas, waits);
    else /* OpenBLAS still runs the exporting attention's products */
        snprintf(out, cap, "compute: %s, %s weights -> %s; BLAS (the export's attention): OpenBLAS %s; OpenMP waits: %s", isa,
                 dt == CP_BF16 ? "bf16" : dt == CP_I8 ? "int8" : "f32", dt == CP_BF16 ? bf16 : dt == CP_I8 ? i8 : f32, blas, waits);
#endif
    return CP_OK;
}

/* the CP_BE_* bits for the matrix dtype now: embed reads packed rows
 * where bf16 matrices are packed in a layout it reads by rows (bf16p's,
 * the AMX tiles'); int8 matrices in the panel order where the int8 kernel
 * is vnni (cpuid or CP_CPU_ISA at creation) */
static unsigned cpu_flags(const cp_backend *be)
{
#ifndef CP_NO_BLAS
    const cpu_impl *im = be->impl;
    return (be->matrix_dtype == CP_BF16 && (im->bf16p || im->amx) ? CP_BE_EMBED_READS_PACKED : 0u) |
           (im->q8 == Q8_VNNI ? CP_BE_Q8_PANELS : 0u) | CP_BE_ATTN_EXPORT_ONLY;
#else
    (void)be;
    return CP_BE_ATTN_EXPORT_ONLY; /* its general attention takes out == NULL */
#endif
}

cp_status cp_backend_cpu_create(cp_backend **out, cp_error *err)
{
    *out = NULL;
    cp_backend *be = cp_calloc(1, sizeof *be, "cpu backend", err);
    cpu_impl *im = be ? cp_calloc(1, sizeof *im, "cpu backend", err) : NULL;
    if (!im) {
        free(be);
        return CP_ENOMEM;
    }
    cp_status rc = cpu_choose_isa(im, err);
    if (rc) {
        free(im), free(be);
        return rc;
    }
    *be = (cp_backend){
        .name = "cpu",
        .matrix_dtype = CP_F32,
        .impl = im,
        .destroy = cpu_destroy,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .upload = cpu_upload,
        .download = cpu_download,
        .copy = cpu_copy,
        .zero = cpu_zero,
        .sync = cpu_sync,
        .embed = cpu_embed_op,
        .rmsnorm = cpu_rmsnorm_op,
        .matmul = cpu_matmul_op,
        .rope = cpu_rope_op,
        .attention = cpu_attention_op,
        .attention_batch = cpu_attention_batch_op,
        .swiglu = cpu_swiglu_op,
        .norm_matmuls = cpu_norm_matmuls_op,
        .swiglu_matmul = cpu_swiglu_matmul_op,
        .place_kv = cpu_place_kv_op,
        .kv_store_bf16 = cpu_kv_store_bf16_op,
        .place_kv_bf16 = cpu_place_kv_bf16_op,
        .sample = cpu_sample_op,
        .set_matrix_dtype = cpu_set_matrix_dtype,
        .describe = cpu_describe,
    };
#ifndef CP_NO_BLAS
    be->pack_matrix = cpu_pack_matrix;
    be->download_matrix = cpu_download_matrix;
    be->free_matrix = cpu_free_matrix;
#endif
    be->flags = cpu_flags(be);
    *out = be;
    return CP_OK;
}
