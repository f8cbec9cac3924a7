/* The CPU backend: host memory and the reference kernels of ops_cpu.c. */
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "ops_cpu.h"

typedef struct cpu_impl {
    float *scratch; /* attention scores, grown on demand */
    size_t scratch_floats;
    cp_status sticky;
    char sticky_msg[128];
} cpu_impl;

static void cpu_destroy(cp_backend *be)
{
    cpu_impl *im = be->impl;
    free(im->scratch);
    free(im);
    free(be);
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

static void cpu_embed_op(cp_backend *be, float *out, const void *table, const int32_t *ids, int n, int dim)
{
    (void)be;
    cpu_embed(out, table, ids, n, dim);
}

static void cpu_rmsnorm_op(cp_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps)
{
    (void)be;
    cpu_rmsnorm(out, x, w, n, dim, eps);
}

static void cpu_matmul_op(cp_backend *be, float *y, int ldy, const float *x, const void *w, const float *bias, int n,
                          int in, int out, int accumulate)
{
    (void)be;
    cpu_matmul(y, ldy, x, w, bias, n, in, out, accumulate);
}

static void cpu_rope_op(cp_backend *be, float *x, int ld, const float *cos, const float *sin, int n, int n_heads,
                        int head_dim)
{
    (void)be;
    cpu_rope(x, ld, cos, sin, n, n_heads, head_dim);
}

static void cpu_attention_op(cp_backend *be, const cp_attn_args *a)
{
    cpu_impl *im = be->impl;
    size_t need = cpu_attention_scratch_floats(a);
    if (need > im->scratch_floats) {
        float *s = realloc(im->scratch, need * sizeof(float));
        if (!s) {
            if (im->sticky == CP_OK) {
                im->sticky = CP_ENOMEM;
                strcpy(im->sticky_msg, "out of memory for attention scores");
            }
            return;
        }
        im->scratch = s;
        im->scratch_floats = need;
    }
    cpu_attention(a, im->scratch);
}

static void cpu_swiglu_op(cp_backend *be, float *out, const float *gate, const float *up, size_t count)
{
    (void)be;
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

cp_status cp_backend_cpu_create(cp_backend **out, cp_error *err)
{
    *out = NULL;
    cp_backend *be = cp_calloc(1, sizeof *be, "cpu backend", err);
    cpu_impl *im = be ? cp_calloc(1, sizeof *im, "cpu backend", err) : NULL;
    if (!im) {
        free(be);
        return CP_ENOMEM;
    }
    *be = (cp_backend){
        .name = "cpu",
        .matrix_dtype = CP_F32,
        .impl = im,
        .destroy = cpu_destroy,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .upload = cpu_upload,
        .download = cpu_upload,
        .copy = cpu_copy,
        .zero = cpu_zero,
        .sync = cpu_sync,
        .embed = cpu_embed_op,
        .rmsnorm = cpu_rmsnorm_op,
        .matmul = cpu_matmul_op,
        .rope = cpu_rope_op,
        .attention = cpu_attention_op,
        .swiglu = cpu_swiglu_op,
        .place_kv = cpu_place_kv_op,
        .sample = cpu_sample_op,
    };
    *out = be;
    return CP_OK;
}
