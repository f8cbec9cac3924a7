/* The CPU backend: creation, the op table, host memory, the small ops of
 * ops_cpu.c, the matrix dtype, and the describe and compute lines; the
 * matrices' ops are backend_cpu_matmul.c's (the GEMMs of gemm_amx*.c /
 * gemm_bf16.c / gemm_dnnl.c ...), attention backend_cpu_attn.c's
 * (backend_cpu_impl.h).  The device check's libc-only build (CP_NO_BLAS)
 * has f32 matrices only. */
#include "backend_cpu_impl.h"

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

void cpu_stick(cpu_impl *im, cp_status rc, const char *msg)
{
    if (im->sticky != CP_OK) return;
    im->sticky = rc;
    snprintf(im->sticky_msg, sizeof im->sticky_msg, "%.200s", msg);
}

cp_status cpu_alloc(cp_backend *be, size_t bytes, void **out, cp_error *err)
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

cp_status cpu_upload(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    (void)be, (void)err;
    memcpy(dst, src, bytes);
    return CP_OK;
}

static cp_status cpu_download(cp_backend *be, void *dst, const void *src, size_t bytes, cp_error *err)
{
    return cpu_upload(be, dst, src, bytes, err);
}

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

#ifndef CP_NO_BLAS
/* Whether the elementwise ops take their AVX-512 forms (q8p_rmsnorm's
 * squares summed in 8 double lanes, not one by one; q8p_swiglu's vector
 * exp, relative error 2e-7, not libm's expf): where the path is
 * approximate already -- int8, and the bf16 tile paths, whose products
 * round every activation to bf16 (2^-9).  The scalar forms were most of
 * the norms' and SwiGLU's time, together a fifth of a bf16 0.5B prefill
 * (make bench-reuse's stages). */
static int cpu_vector_elementwise(const cp_backend *be)
{
    const cpu_impl *im = be->impl;
    return (be->matrix_dtype == CP_I8 && q8p_takes(im->q8, Q8P_MIN_ROWS + 1)) || (be->matrix_dtype == CP_BF16 && (im->amx || im->bf16p));
}
#endif

static void cpu_rmsnorm_op(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
#ifndef CP_NO_BLAS
    if (cpu_vector_elementwise(be)) { /* the vector norm, at every n (batch invariance) */
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

/* RoPE and placement's rotation on AVX-512 lanes on the paths that have
 * them (the same bits as the scalar loops, which the generic and avx2
 * paths and the libc-only build run) */
#if defined(__x86_64__) && !defined(CP_NO_BLAS)
#define CPU_VECTOR_ROPE(be) (((const cpu_impl *)(be)->impl)->dot_isa >= CPU_ISA_AVX512)
#endif

static void cpu_rope_op(cp_backend *be, float *x, int ld, const float *cos, const float *sin, int n, int n_heads,
                        int head_dim)
{
#if defined(__x86_64__) && !defined(CP_NO_BLAS)
    if (CPU_VECTOR_ROPE(be)) {
        cpu_rope_avx512(x, ld, cos, sin, n, n_heads, head_dim);
        return;
    }
#else
    (void)be;
#endif
    cpu_rope(x, ld, cos, sin, n, n_heads, head_dim);
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
    if (cpu_vector_elementwise(be)) {
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
#if defined(__x86_64__) && !defined(CP_NO_BLAS)
    if (CPU_VECTOR_ROPE(be)) {
        cpu_place_kv_avx512(k, k_pre, v, src_k, src_v, src_ld, n, cos, sin, n_kv_heads, head_dim);
        return;
    }
#else
    (void)be;
#endif
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
                     "order, batch-invariant (activations rounded to bf16); plain matrices: oneDNN matmul (impl %s); attention on AMX bf16 tiles "
                     "(head_dim a multiple of 32)",
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
                 "integer dot kernels for n <= %d, the vnni prefill kernel past); attention on AMX bf16 tiles (head_dim a multiple of 32; "
                 "else f32)%s",
                 AMX_I8_MIN_ROWS, Q8P_MIN_ROWS, im->i8_attn ? "; an export alone, without output rows: bf16, oneDNN" : "");
        return im->desc;
    }
    if (be->matrix_dtype == CP_I8 && im->q8 == Q8_VNNI) {
        snprintf(im->desc, sizeof im->desc,
                 "int8 weights (per-channel scales), packed at load in the vnni panel order: the register-blocked avx512vnni kernel "
                 "at every n (row-major matrices: integer dot kernels for n <= %d, the vnni prefill kernel past); attention in f32%s",
                 Q8P_MIN_ROWS, im->i8_attn ? " (an export alone, without output rows: bf16, oneDNN)" : "");
        return im->desc;
    }
    if (be->matrix_dtype == CP_I8) {
        snprintf(im->desc, sizeof im->desc,
                 "int8 weights (per-channel scales): %s integer dot kernels, activations quantized per row, %s %d%s; attention in f32%s",
                 q8_isa_name(im->q8), q8p_takes(im->q8, Q8P_MIN_ROWS + 1) ? "n >" : "every batch size, past", Q8P_MIN_ROWS,
                 q8p_takes(im->q8, Q8P_MIN_ROWS + 1) ? ": the register-blocked vnni prefill kernel" : " rows too",
                 im->i8_attn ? " (an export alone, without output rows: bf16, oneDNN)" : "");
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
    /* a forced path stands for the CPU whose best it is: what lies above it
     * is not there (CP_CPU_ISA=avx512vnni is Cascade Lake, no bf16, so its
     * int8 exports stay f32 as they would there) */
    if (forced && *forced) {
        cpu_features *f = &im->feat;
        if (im->isa != CPU_ISA_AMX) f->amx_bf16 = 0;
        if (im->isa != CPU_ISA_AMX && im->isa != CPU_ISA_AVX512_BF16) f->avx512_bf16 = 0;
        if (im->isa == CPU_ISA_GENERIC || im->isa == CPU_ISA_AVX2 || im->isa == CPU_ISA_AVX512) f->avx512_vnni = 0;
        if (im->isa == CPU_ISA_GENERIC || im->isa == CPU_ISA_AVX2) f->avx512 = 0;
        if (im->isa == CPU_ISA_GENERIC) f->avx2_fma = 0;
    }
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
    im->attn_k = im->dot_isa >= CPU_ISA_AVX512 ? CPU_ATTN_AVX512 : im->dot_isa == CPU_ISA_AVX2 ? CPU_ATTN_AVX2 : CPU_ATTN_PORTABLE;
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
    char pair[96];
    snprintf(pair, sizeof pair, "own f32 pair kernel (%s at head_dim a multiple of 16)", cpu_attn_kernel_name(cpu_attn_pair_kernel(16, im->attn_k)));
    if (per_dtype)
        snprintf(out, cap, "compute: %s; f32 weights -> %s; bf16 -> %s; int8 -> %s; BLAS (attention without output rows): OpenBLAS %s; OpenMP waits: %s",
                 isa, f32, bf16, i8, blas, waits);
    else /* OpenBLAS still runs the exporting attention's products */
        snprintf(out, cap, "compute: %s, %s weights -> %s; attention -> %s; BLAS (attention without output rows): OpenBLAS %s; OpenMP waits: %s",
                 isa, dt == CP_BF16 ? "bf16" : dt == CP_I8 ? "int8" : "f32", dt == CP_BF16 ? bf16 : dt == CP_I8 ? i8 : f32,
                 im->amx && dt != CP_F32 ? "own AMX bf16 tiles (head_dim a multiple of 32; else own f32 pair kernel)" : pair, blas,
                 waits);
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
           (im->q8 == Q8_VNNI ? CP_BE_Q8_PANELS : 0u) | CP_BE_ATTN_EXPORT_ONLY | CP_BE_ATTN_EXPORT_ROWS | CP_BE_HOST_MEMORY;
#else
    (void)be;
    return CP_BE_ATTN_EXPORT_ONLY | CP_BE_HOST_MEMORY; /* its general attention takes out == NULL */
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
        .mlp = cpu_mlp_op,
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
