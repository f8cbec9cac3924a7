/* The CPU backend's weight matrices (backend_cpu_impl.h): packing at load
 * in the layout the path's kernel reads, reading a packed one back,
 * embedding rows, and matmul by dtype and layout -- the GEMMs of
 * gemm_amx*.c, gemm_bf16*.c, gemm_dnnl.c, gemm_f32.c and gemm_i8*.c. */
#include "backend_cpu_impl.h"

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
cp_status cpu_download_matrix(cp_backend *be, void *dst, const cp_matrix *w, cp_error *err)
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
void cpu_free_matrix(cp_backend *be, cp_matrix *w)
{
    cpu_impl *im = be->impl;
    if (w->layout != CP_LAYOUT_ROWS && im->n_packed) im->n_packed--;
    free(w->data);
}
#endif

void cpu_embed_op(cp_backend *be, float *out, const cp_matrix *table, const int32_t *ids, int n, int dim)
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
    if (im->amx && n > AMX_I8_MIN_ROWS) { /* the tile kernel's fused form: the same integers and epilogue */
        for (int j = 0; j < count; j++)
            if (cp_q8_layout(o[j].w) != CP_Q8_PANELS) return 0; /* a row-major weight: the plain ops */
        const int threads = omp_get_max_threads();
        cp_error e = { 0 };
        if (gemm_scratch_reserve(im, cp_amx_i8_scratch(n, in, threads), "the AMX int8 GEMM's scratch") &&
            cp_amx_i8_fused(src, o, count, n, in, im->gemm_scratch, threads, &e))
            cpu_stick(im, e.code, e.msg);
        return 1;
    }
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

#ifndef CP_NO_BLAS
/* the fused bf16 form on AMX tiles (cp_amx_bf16_fused) when every weight
 * is packed in the tiles' layout: 0 when not (the caller runs the plain
 * ops), 1 when done (or its failure stuck on the backend) */
static int fused_bf16(cpu_impl *im, const q8p_src *src, const cp_mm_out *outs, int count, int n, int in, int accumulate)
{
    if (!im->amx || count < 1 || count > Q8P_MAX_OUTS) return 0;
    cp_amx_bf16_layout L[Q8P_MAX_OUTS];
    cp_amx_bf16_out o[Q8P_MAX_OUTS];
    for (int j = 0; j < count; j++) {
        const cp_matrix *w = outs[j].w;
        if (w->layout != PACK_AMX) return 0;
        if (w->rows != outs[j].out || w->cols != in) {
            cpu_stick(im, CP_EINVAL, "fused bf16 matmul: a packed weight of another shape than asked for");
            return 1;
        }
        if (!amx_layout(im, w, &L[j])) return 1;
        o[j] = (cp_amx_bf16_out){ .y = outs[j].y, .ldy = outs[j].ldy, .wp = w->data, .layout = &L[j], .bias = outs[j].bias,
                                  .accumulate = accumulate };
    }
    const int threads = omp_get_max_threads();
    cp_error e = { 0 };
    if (gemm_scratch_reserve(im, cp_amx_bf16_fused_scratch(n, in, threads), "the AMX bf16 GEMM's staged rows") &&
        cp_amx_bf16_fused(src, o, count, n, in, im->gemm_scratch, threads, &e))
        cpu_stick(im, e.code, e.msg);
    return 1;
}
#endif

int cpu_norm_matmuls_op(cp_backend *be, const float *x, const float *norm_w, float eps, int n, int in, const cp_mm_out *outs,
                        int count)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    const q8p_src src = { .kind = Q8P_SRC_NORM, .x = x, .norm_w = norm_w, .eps = eps };
    if (be->matrix_dtype == CP_BF16) return fused_bf16(im, &src, outs, count, n, in, 0);
    if (be->matrix_dtype != CP_I8 || im->q8 != Q8_VNNI || count < 1 || count > Q8P_MAX_OUTS) return 0;
    q8p_out o[Q8P_MAX_OUTS];
    for (int j = 0; j < count; j++) o[j] = (q8p_out){ outs[j].y, outs[j].ldy, outs[j].w->data, outs[j].bias, outs[j].out, 0 };
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

int cpu_swiglu_matmul_op(cp_backend *be, float *y, int ldy, const float *gate, const float *up, const cp_matrix *w, int n, int in,
                         int out, int accumulate)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    const q8p_src src = { .kind = Q8P_SRC_SWIGLU, .x = gate, .up = up };
    if (be->matrix_dtype == CP_BF16) {
        const cp_mm_out o = { y, ldy, w, NULL, out };
        return fused_bf16(im, &src, &o, 1, n, in, accumulate);
    }
    if (be->matrix_dtype != CP_I8 || im->q8 != Q8_VNNI) return 0;
    const q8p_out o = { y, ldy, w->data, NULL, out, accumulate };
    return fused_i8(im, &src, &o, 1, n, in);
#else
    (void)be, (void)y, (void)ldy, (void)gate, (void)up, (void)w, (void)n, (void)in, (void)out, (void)accumulate;
    return 0;
#endif
}

int cpu_mlp_op(cp_backend *be, float *x, const float *norm_w, float eps, int n, int hidden, const cp_matrix *gate, const cp_matrix *up,
               const cp_matrix *down, int inter)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    if (be->matrix_dtype != CP_BF16 || !im->amx || gate->layout != PACK_AMX || up->layout != PACK_AMX || down->layout != PACK_AMX) return 0;
    if (gate->rows != inter || gate->cols != hidden || up->rows != inter || up->cols != hidden || down->rows != hidden || down->cols != inter) {
        cpu_stick(im, CP_EINVAL, "fused bf16 mlp: a packed weight of another shape than asked for");
        return 1;
    }
    cp_amx_bf16_layout Lg, Lu, Ld;
    if (!amx_layout(im, gate, &Lg) || !amx_layout(im, up, &Lu) || !amx_layout(im, down, &Ld)) return 1;
    const q8p_src src = { .kind = Q8P_SRC_NORM, .x = x, .norm_w = norm_w, .eps = eps };
    const cp_amx_bf16_mlp_w w = { gate->data, up->data, down->data, &Lg, &Lu, &Ld };
    const int threads = omp_get_max_threads();
    cp_error e = { 0 };
    if (gemm_scratch_reserve(im, cp_amx_bf16_mlp_scratch(n, hidden, inter, threads), "the AMX bf16 MLP's staged rows") &&
        cp_amx_bf16_mlp(&src, &w, x, hidden, 1, n, im->gemm_scratch, threads, &e))
        cpu_stick(im, e.code, e.msg);
    return 1;
#else
    (void)be, (void)x, (void)norm_w, (void)eps, (void)n, (void)hidden, (void)gate, (void)up, (void)down, (void)inter;
    return 0;
#endif
}

void cpu_matmul_op(cp_backend *be, float *y, int ldy, const float *x, const cp_matrix *w, const float *bias, int n,
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

#ifndef CP_NO_BLAS
/* bf16 W in the AMX tiles' layout on the amx path (oneDNN's where
 * cp_amx_ready failed), in bf16p's on the avx512bf16 one, f32 W in f32p's
 * where the f32 kernels are AVX-512 (backend.h), named in the handle's layout;
 * plain (NULL) on every other path */
cp_status cpu_pack_matrix(cp_backend *be, const void *w, int rows, int cols, cp_matrix *out, size_t *bytes, cp_error *err)
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
