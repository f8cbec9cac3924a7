/* The CPU backend's attention (backend_cpu_impl.h): one call by the pair
 * kernel, its export and sensitive mass from the same scores, or a
 * step's batch with its decode items in one parallel region. */
#include "backend_cpu_impl.h"

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

/* whether attention(a) runs on AMX bf16 tiles (gemm_amx_attn.c): the amx
 * path with bf16 or int8 matrices (whose products already round the
 * activations), head_dim a multiple of 32 -- every call with output rows,
 * decode steps included, so that a row's bits never depend on the call
 * it came in */
#ifndef CP_NO_BLAS
static int cpu_attention_tiles(const cp_backend *be, const cp_attn_args *a)
{
    const cpu_impl *im = be->impl;
    return im->amx && (be->matrix_dtype == CP_BF16 || be->matrix_dtype == CP_I8) && a->out && a->head_dim % 32 == 0;
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
 * decode kernel, or the BLAS ones (cpu_attention) -- what an export-only
 * call (out NULL) is computed by in the BLAS builds, and every call in the
 * libc-only one (cpu_attention_op) */
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
        cpu_attention_decode(a, im->scratch, im->attn_k);
        return;
    }
    if (!a->k16) {
        cpu_attention_with(a, im->scratch, im->attn_k);
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
    cpu_attention_with(&b, im->scratch, im->attn_k);
}

/* Batch invariance: every row's output comes from the pair kernel
 * (ops_cpu.h, cpu_attention_rows) or, on the amx path, the tile kernel
 * (cp_amx_attention), at every row count --
 * oneDNN's bf16 attention and the BLAS products reduce over blocks whose
 * edges move with the chunk's rows and keys, so a row's output there
 * depends on what it was computed with.  An export or a sensitive mass
 * (a cacheprune scoring prefill) comes from the same pass, off the
 * probabilities the output rows are weighted with: a second QK^T and
 * softmax over every key cost a third of a kit-model prefill.  A call
 * with no output rows (out NULL) computes only the export, by the general
 * kernels.  The libc-only build keeps its double-precision reference,
 * which is per row too. */
void cpu_attention_op(cp_backend *be, const cp_attn_args *a)
{
#ifndef CP_NO_BLAS
    cpu_impl *im = be->impl;
    if (!a->out) { /* an export-only call: the general kernels' QK^T and softmax, no PV product */
        if (a->export_rows) {
            cpu_stick(im, CP_EINVAL, "attention: export_rows needs output rows (an export-only call exports every row)");
            return;
        }
        attention_general_op(be, a);
        return;
    }
    const int threads = omp_get_max_threads();
    if (cpu_attention_tiles(be, a)) {
        if (!attn_scratch_reserve(im, (cp_amx_attn_scratch(a, threads) + sizeof(float) - 1) / sizeof(float))) return;
        cp_error e = { 0 };
        if (cp_amx_attention(a, im->scratch, threads, &e)) cpu_stick(im, e.code, e.msg);
        return;
    }
    if (!attn_scratch_reserve(im, cpu_attention_rows_scratch_floats(a, threads, im->attn_k))) return;
    cpu_attention_rows(a, im->scratch, threads, im->attn_k); /* an export and a mass from the output's own scores */
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
    return !cpu_attention_dnnl(be, a) && !cpu_attention_tiles(be, a) && cpu_attention_decode_fits(a);
#endif
}

/* Every item that attention() would send to the decode kernel runs
 * in one parallel region over all their (row, KV head) pairs; the rest
 * (prefill chunks, exports) through attention() one by one, after it (they
 * share the scratch). */
void cpu_attention_batch_op(cp_backend *be, const cp_attn_args *a, int count)
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
        cpu_attention_decode_many(im->batch_args, nd, im->batch_first, im->batch_off, im->scratch, im->attn_k);
    }
    for (int c = 0; c < count; c++)
        if (!cpu_attention_decodes(be, &a[c])) cpu_attention_op(be, &a[c]);
}
