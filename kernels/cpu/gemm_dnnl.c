/* oneDNN bf16 matmul (gemm_dnnl.h).  oneDNN 2.6.3 as Debian builds it runs
 * on OpenMP (libgomp): the same pool as our loops and OpenBLAS's, so its
 * threads never compete with another pool's spinning workers. */
#include "gemm_dnnl.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dtype.h"

#define DNNL_CACHE 48

typedef struct prim_entry {
    int in, out, packed; /* the key (rows: always CP_DNNL_ROWS); in == 0: empty */
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst;
} prim_entry;

struct cp_dnnl_mm {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    prim_entry cache[DNNL_CACHE];
    int next_evict;
    uint16_t *xb; /* activations in bf16, whole blocks of CP_DNNL_ROWS rows (the last zero-padded), grown on demand */
    size_t xb_elems;
    float *yb; /* one block's output, CP_DNNL_ROWS x out, grown on demand */
    size_t yb_floats;
    char impl[64];
};

static void entry_clear(prim_entry *e)
{
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->src) dnnl_memory_destroy(e->src);
    if (e->wei) dnnl_memory_destroy(e->wei);
    if (e->dst) dnnl_memory_destroy(e->dst);
    memset(e, 0, sizeof *e);
}

void cp_dnnl_mm_destroy(cp_dnnl_mm *g)
{
    if (!g) return;
    for (int i = 0; i < DNNL_CACHE; i++) entry_clear(&g->cache[i]);
    if (g->stream) dnnl_stream_destroy(g->stream);
    if (g->eng) dnnl_engine_destroy(g->eng);
    free(g->xb);
    free(g->yb);
    free(g);
}

cp_status cp_dnnl_mm_create(cp_dnnl_mm **out, cp_error *err)
{
    *out = NULL;
    cp_dnnl_mm *g = cp_calloc(1, sizeof *g, "oneDNN context", err);
    if (!g) return CP_ENOMEM;
    if (dnnl_engine_create(&g->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&g->stream, g->eng, dnnl_stream_default_flags) != dnnl_success) {
        cp_dnnl_mm_destroy(g);
        return cp_fail(err, CP_EUNSUPPORTED, "oneDNN: cannot create a CPU engine and stream");
    }
    *out = g;
    return CP_OK;
}

const char *cp_dnnl_mm_isa(void)
{
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    default: return "other";
    }
}

const char *cp_dnnl_mm_last_impl(const cp_dnnl_mm *g)
{
    return g->impl;
}

/* The weights' md W^T [in, out] bf16: the row-major W [out, in] read as
 * "ba", or (tag any) what a primitive chooses. */
static dnnl_status_t weights_md(dnnl_memory_desc_t *wmd, int in, int out, dnnl_format_tag_t tag)
{
    dnnl_dims_t wd = { in, out };
    return dnnl_memory_desc_init_by_tag(wmd, 2, wd, dnnl_bf16, tag);
}

/* The packed layout for W [out, in]: the weights md a primitive at
 * CP_DNNL_REP_N rows picks when left free (gemm_dnnl.h). */
static cp_status packed_md(cp_dnnl_mm *g, int in, int out, dnnl_memory_desc_t *wmd, cp_error *err)
{
    if (in < 1 || out < 1) return cp_fail(err, CP_EINVAL, "oneDNN: cannot pack a [%d x %d] matrix", out, in);
    dnnl_memory_desc_t smd, dmd, any;
    dnnl_dims_t sd = { CP_DNNL_REP_N, in }, dd = { CP_DNNL_REP_N, out };
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&smd, 2, sd, dnnl_bf16, dnnl_ab);
    if (s == dnnl_success) s = weights_md(&any, in, out, dnnl_format_tag_any);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&dmd, 2, dd, dnnl_f32, dnnl_ab);
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &smd, &any, NULL, &dmd);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, NULL, g->eng, NULL);
    const dnnl_memory_desc_t *q = s == dnnl_success ? dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0) : NULL;
    if (q) *wmd = *q;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (!q)
        return cp_fail(err, CP_EUNSUPPORTED, "oneDNN: no bf16 matmul for [%d x %d] weights on this CPU to pack them for (status %d)",
                       out, in, (int)s);
    return CP_OK;
}

/* The primitive for one weight shape: src [CP_DNNL_ROWS, in] bf16 dense,
 * weights W^T [in, out] bf16 (row-major W [out, in] read as "ba", or
 * packed), dst [CP_DNNL_ROWS, out] f32 dense; no post-op (accumulation is
 * run()'s own add, the same one f32 add a sum post-op would make). */
static cp_status make_entry(cp_dnnl_mm *g, prim_entry *e, int in, int out, int packed, cp_error *err)
{
    const int n = CP_DNNL_ROWS;
    dnnl_memory_desc_t smd, wmd, dmd;
    dnnl_dims_t sd = { n, in }, dd = { n, out };
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    if (packed) {
        cp_status rc = packed_md(g, in, out, &wmd, err);
        if (rc) return rc;
    }
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&smd, 2, sd, dnnl_bf16, dnnl_ab);
    if (s == dnnl_success && !packed) s = weights_md(&wmd, in, out, dnnl_ba);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&dmd, 2, dd, dnnl_f32, dnnl_ab);
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &smd, &wmd, NULL, &dmd);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, NULL, g->eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&e->prim, pd);
    if (s == dnnl_success) s = dnnl_memory_create(&e->src, &smd, g->eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&e->wei, &wmd, g->eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&e->dst, &dmd, g->eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
            snprintf(g->impl, sizeof g->impl, "%s", impl);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (s != dnnl_success) {
        entry_clear(e);
        return cp_fail(err, CP_EUNSUPPORTED, "oneDNN: no bf16 matmul for [%d x %d] x [%d x %d]^T%s on this CPU (status %d)", n, in,
                       out, in, packed ? " over packed weights" : "", (int)s);
    }
    *e = (prim_entry){ in, out, packed, e->prim, e->src, e->wei, e->dst };
    return CP_OK;
}

static cp_status find_entry(cp_dnnl_mm *g, int in, int out, int packed, prim_entry **out_e, cp_error *err)
{
    for (int i = 0; i < DNNL_CACHE; i++) {
        prim_entry *e = &g->cache[i];
        if (e->in == in && e->out == out && e->packed == packed) return *out_e = e, CP_OK;
    }
    prim_entry *e = NULL;
    for (int i = 0; i < DNNL_CACHE && !e; i++)
        if (!g->cache[i].in) e = &g->cache[i];
    if (!e) { /* full: round-robin eviction (shapes of one model are few) */
        e = &g->cache[g->next_evict];
        g->next_evict = (g->next_evict + 1) % DNNL_CACHE;
        entry_clear(e);
    }
    *out_e = e;
    return make_entry(g, e, in, out, packed, err);
}

/* Batch invariance (gemm_dnnl.h): the rows go through one primitive of
 * CP_DNNL_ROWS rows per weight shape, a block at a time, the last block
 * zero-padded; each block's output lands in yb and is copied (or added)
 * into y.  Which block a row is in, its place there and what the other
 * rows hold change nothing in its arithmetic. */
static cp_status run(cp_dnnl_mm *g, float *y, int ldy, const float *x, const void *w, int packed, int n, int in, int out,
                     int accumulate, cp_error *err)
{
    const int B = CP_DNNL_ROWS, blocks = (n + B - 1) / B;
    const size_t need = (size_t)blocks * B * in, yneed = (size_t)B * out;
    if (need > g->xb_elems) {
        uint16_t *p = realloc(g->xb, need * sizeof *p);
        if (!p) return cp_fail(err, CP_ENOMEM, "oneDNN matmul: out of memory for %zu bf16 activations", need);
        g->xb = p;
        g->xb_elems = need;
    }
    if (yneed > g->yb_floats) {
        float *p = aligned_alloc(64, (yneed * sizeof *p + 63) & ~(size_t)63);
        if (!p) return cp_fail(err, CP_ENOMEM, "oneDNN matmul: out of memory for a %d x %d output block", B, out);
        free(g->yb);
        g->yb = p;
        g->yb_floats = yneed;
    }
    prim_entry *e;
    cp_status rc = find_entry(g, in, out, packed, &e, err);
    if (rc) return rc;
    uint16_t *xb = g->xb;
    const size_t have = (size_t)n * in;
#pragma omp parallel for schedule(static) if (have > 65536)
    for (size_t i = 0; i < have; i++) xb[i] = cp_f32_to_bf16(x[i]);
    memset(xb + have, 0, (need - have) * sizeof *xb);
    dnnl_memory_set_data_handle(e->wei, (void *)w);
    dnnl_memory_set_data_handle(e->dst, g->yb);
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, e->src }, { DNNL_ARG_WEIGHTS, e->wei }, { DNNL_ARG_DST, e->dst } };
    for (int b = 0; b < blocks; b++) {
        dnnl_memory_set_data_handle(e->src, xb + (size_t)b * B * in);
        if (dnnl_primitive_execute(e->prim, g->stream, 3, args) != dnnl_success || dnnl_stream_wait(g->stream) != dnnl_success)
            return cp_fail(err, CP_EDEVICE, "oneDNN: bf16 matmul [%d x %d] x [%d x %d]^T (rows %d..%d of %d) failed", B, in, out, in,
                           b * B, b * B + B - 1, n);
        const int rows = n - b * B < B ? n - b * B : B;
        for (int r = 0; r < rows; r++) {
            float *yr = y + (size_t)(b * B + r) * ldy;
            const float *src = g->yb + (size_t)r * out;
            if (accumulate)
                for (int j = 0; j < out; j++) yr[j] += src[j];
            else memcpy(yr, src, (size_t)out * sizeof *yr);
        }
    }
    return CP_OK;
}

cp_status cp_dnnl_mm_run(cp_dnnl_mm *g, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out,
                        int accumulate, cp_error *err)
{
    return run(g, y, ldy, x, w, 0, n, in, out, accumulate, err);
}

cp_status cp_dnnl_mm_run_packed(cp_dnnl_mm *g, float *y, int ldy, const float *x, const void *packed, int n, int in, int out,
                               int accumulate, cp_error *err)
{
    return run(g, y, ldy, x, packed, 1, n, in, out, accumulate, err);
}

size_t cp_dnnl_mm_packed_bytes(cp_dnnl_mm *g, int in, int out, cp_error *err)
{
    dnnl_memory_desc_t md;
    if (packed_md(g, in, out, &md, err)) return 0;
    return dnnl_memory_desc_get_size(&md);
}

/* One oneDNN reorder between the plain "ba" view of W and the packed md
 * pmd (packed_md's, asked once by the caller); to_packed picks the
 * direction. */
static cp_status reorder(cp_dnnl_mm *g, void *packed, const dnnl_memory_desc_t *pmd_in, uint16_t *plain, int in, int out, int to_packed,
                         cp_error *err)
{
    dnnl_memory_desc_t pmd = *pmd_in, wmd;
    dnnl_memory_t pm = NULL, wm = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_status_t s = weights_md(&wmd, in, out, dnnl_ba);
    if (s == dnnl_success) s = dnnl_memory_create(&pm, &pmd, g->eng, packed);
    if (s == dnnl_success) s = dnnl_memory_create(&wm, &wmd, g->eng, plain);
    if (s == dnnl_success)
        s = to_packed ? dnnl_reorder_primitive_desc_create(&pd, &wmd, g->eng, &pmd, g->eng, NULL)
                      : dnnl_reorder_primitive_desc_create(&pd, &pmd, g->eng, &wmd, g->eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&prim, pd);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = { { DNNL_ARG_FROM, to_packed ? wm : pm }, { DNNL_ARG_TO, to_packed ? pm : wm } };
        s = dnnl_primitive_execute(prim, g->stream, 2, args);
        if (s == dnnl_success) s = dnnl_stream_wait(g->stream);
    }
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (wm) dnnl_memory_destroy(wm);
    if (pm) dnnl_memory_destroy(pm);
    if (s != dnnl_success)
        return cp_fail(err, CP_EDEVICE, "oneDNN: reordering [%d x %d] weights %s the packed layout failed (status %d)", out, in,
                       to_packed ? "into" : "out of", (int)s);
    return CP_OK;
}

cp_status cp_dnnl_mm_pack(cp_dnnl_mm *g, void *dst, size_t bytes, const uint16_t *w, int in, int out, cp_error *err)
{
    dnnl_memory_desc_t pmd;
    cp_status rc = packed_md(g, in, out, &pmd, err);
    if (rc) return rc;
    if (bytes != dnnl_memory_desc_get_size(&pmd))
        return cp_fail(err, CP_EINVAL, "oneDNN: packed [%d x %d] weights take %zu bytes, not %zu", out, in,
                       dnnl_memory_desc_get_size(&pmd), bytes);
    /* the padding is zero so padded k-pairs add nothing */
    memset(dst, 0, bytes);
    return reorder(g, dst, &pmd, (uint16_t *)(uintptr_t)w, in, out, 1, err); /* oneDNN reads FROM only */
}

cp_status cp_dnnl_mm_unpack(cp_dnnl_mm *g, uint16_t *dst, const void *packed, int in, int out, cp_error *err)
{
    dnnl_memory_desc_t pmd;
    cp_status rc = packed_md(g, in, out, &pmd, err);
    if (rc) return rc;
    return reorder(g, (void *)(uintptr_t)packed, &pmd, dst, in, out, 0, err);
}

void cp_dnnl_mm_cache_counts(const cp_dnnl_mm *g, int *prims, int *packed_prims)
{
    *prims = *packed_prims = 0;
    for (int i = 0; i < DNNL_CACHE; i++)
        if (g->cache[i].in) ++*prims, *packed_prims += g->cache[i].packed;
}

dnnl_engine_t cp_dnnl_mm_engine(const cp_dnnl_mm *g)
{
    return g->eng;
}

dnnl_stream_t cp_dnnl_mm_stream(const cp_dnnl_mm *g)
{
    return g->stream;
}
