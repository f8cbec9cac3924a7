/* bf16 attention through oneDNN matmul (attn_dnnl.h).  The layout it
 * builds once per call: Q, K and V in bf16, head-major and dense
 * ([head][row][head_dim]), so every per-head matmul reads plain dense
 * operands oneDNN's brgemm takes directly (strided views of the f32 rows
 * would not be), and a K/V head is rounded once for the group of query
 * heads that share it. */
#include "attn_dnnl.h"

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../dtype.h"
#include "ops_cpu.h"

#define ATTN_CACHE 32

enum { QK = 1, PV = 2 };

/* One product's geometry, 4-D: [G][R][rows][cols] for A and C, [G][1][..]
 * for B (one K / V head per group of R query heads, broadcast by oneDNN);
 * a single head's product is G = R = 1 */
typedef struct attn_geom {
    int64_t m, n, k, G, R;
    int64_t as[4], bs[4], cs[4]; /* element strides of A, B (as [k][n]) and C */
} attn_geom;

typedef struct attn_prim {
    int kind; /* the key with geom and scale; 0: empty */
    attn_geom geom;
    float scale;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst;
} attn_prim;

struct cp_dnnl_attn {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    attn_prim cache[ATTN_CACHE];
    int next_evict;
    uint16_t *buf; /* Q, K, V and the probabilities in bf16 */
    size_t buf_elems;
    float *S; /* one block's scores */
    size_t s_floats;
    char last_impl[64]; /* the implementation oneDNN chose for the last primitive made */
};

static void prim_clear(attn_prim *e)
{
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->src) dnnl_memory_destroy(e->src);
    if (e->wei) dnnl_memory_destroy(e->wei);
    if (e->dst) dnnl_memory_destroy(e->dst);
    memset(e, 0, sizeof *e);
}

void cp_dnnl_attn_destroy(cp_dnnl_attn *t)
{
    if (!t) return;
    for (int i = 0; i < ATTN_CACHE; i++) prim_clear(&t->cache[i]);
    free(t->buf);
    free(t->S);
    free(t);
}

cp_status cp_dnnl_attn_create(cp_dnnl_attn **out, cp_dnnl_mm *mm, cp_error *err)
{
    *out = NULL;
    cp_dnnl_attn *t = cp_calloc(1, sizeof *t, "oneDNN attention", err);
    if (!t) return CP_ENOMEM;
    t->eng = cp_dnnl_mm_engine(mm);
    t->stream = cp_dnnl_mm_stream(mm);
    *out = t;
    return CP_OK;
}

/* C[g][r] (f32) = scale * A[g][r] . B[g] per the geometry's strides, A
 * and B bf16: QK^T (B the K rows read as [k][n]) or PV (B the V rows). */
static cp_status make_prim(cp_dnnl_attn *t, attn_prim *e, int kind, const attn_geom *gm, float scale, cp_error *err)
{
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = { gm->G, gm->R, gm->m, gm->k }, bd = { gm->G, 1, gm->k, gm->n }, cd = { gm->G, gm->R, gm->m, gm->n };
    dnnl_dims_t as = { gm->as[0], gm->as[1], gm->as[2], gm->as[3] }, bs = { gm->bs[0], gm->bs[1], gm->bs[2], gm->bs[3] },
                cs = { gm->cs[0], gm->cs[1], gm->cs[2], gm->cs[3] };
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(&amd, 4, ad, dnnl_bf16, as);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_strides(&bmd, 4, bd, dnnl_bf16, bs);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_strides(&cmd, 4, cd, dnnl_f32, cs);
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd);
    if (s == dnnl_success) s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success && scale != 1.0f) s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &scale);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, attr, t->eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&e->prim, pd);
    if (s == dnnl_success) s = dnnl_memory_create(&e->src, &amd, t->eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&e->wei, &bmd, t->eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&e->dst, &cmd, t->eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
            snprintf(t->last_impl, sizeof t->last_impl, "%s", impl);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) {
        prim_clear(e);
        return cp_fail(err, CP_EUNSUPPORTED,
                       "oneDNN attention: no bf16 matmul for the %s product [%lld x %d x %lld x %lld] x [%lld x %lld] (status %d)",
                       kind == QK ? "QK^T" : "PV", (long long)gm->G, (int)gm->R, (long long)gm->m, (long long)gm->k, (long long)gm->k,
                       (long long)gm->n, (int)s);
    }
    e->kind = kind, e->geom = *gm, e->scale = scale;
    return CP_OK;
}

static cp_status gemm_geom(cp_dnnl_attn *t, int kind, const attn_geom *gm, float scale, const uint16_t *A, const uint16_t *B, float *C,
                           cp_error *err)
{
    attn_prim *e = NULL;
    for (int i = 0; i < ATTN_CACHE && !e; i++) {
        attn_prim *c = &t->cache[i];
        if (c->kind == kind && c->scale == scale && memcmp(&c->geom, gm, sizeof *gm) == 0) e = c;
    }
    if (!e) {
        for (int i = 0; i < ATTN_CACHE && !e; i++)
            if (!t->cache[i].kind) e = &t->cache[i];
        if (!e) { /* full: round robin (a prefill's shapes repeat over its layers) */
            e = &t->cache[t->next_evict];
            t->next_evict = (t->next_evict + 1) % ATTN_CACHE;
            prim_clear(e);
        }
        cp_status rc = make_prim(t, e, kind, gm, scale, err);
        if (rc) return rc;
    }
    dnnl_memory_set_data_handle(e->src, (void *)A);
    dnnl_memory_set_data_handle(e->wei, (void *)B);
    dnnl_memory_set_data_handle(e->dst, C);
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, e->src }, { DNNL_ARG_WEIGHTS, e->wei }, { DNNL_ARG_DST, e->dst } };
    if (dnnl_primitive_execute(e->prim, t->stream, 3, args) != dnnl_success || dnnl_stream_wait(t->stream) != dnnl_success)
        return cp_fail(err, CP_EDEVICE, "oneDNN attention: the bf16 %s product failed", kind == QK ? "QK^T" : "PV");
    return CP_OK;
}

/* One head's product: C[m, n] (row stride ldd) = scale * A[m, k] . B, A
 * dense, B dense as B^T [n, k] for QK or as B [k, n] for PV. */
static cp_status gemm(cp_dnnl_attn *t, int kind, int m, int n, int k, float scale, const uint16_t *A, const uint16_t *B, float *C,
                      int ldd, cp_error *err)
{
    const int64_t am = (int64_t)m * k, bm = (int64_t)k * n, cm = (int64_t)m * ldd;
    attn_geom gm = { .m = m, .n = n, .k = k, .G = 1, .R = 1, .as = { am, am, k, 1 }, .cs = { cm, cm, ldd, 1 } };
    if (kind == QK) gm.bs[0] = bm, gm.bs[1] = bm, gm.bs[2] = 1, gm.bs[3] = k;
    else gm.bs[0] = bm, gm.bs[1] = bm, gm.bs[2] = n, gm.bs[3] = 1;
    return gemm_geom(t, kind, &gm, scale, A, B, C, err);
}

/* cp_f32_to_bf16 as selects (the same value for every input, NaNs
 * quieted alike): its branch kept to_heads' loop scalar, ~5 % of the
 * attention (perf, 1024 tokens) */
static inline uint16_t bf16_select(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t nan = (u >> 16) | 0x40, rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
}

/* dst[h][r][d] = bf16(src[r * ld + h * hd + d]): rows x heads of hd */
static void to_heads(uint16_t *dst, const float *src, int rows, int heads, int hd)
{
    const size_t ld = (size_t)heads * hd;
#pragma omp parallel for schedule(static) if ((size_t)rows * ld > 65536)
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++) {
            const float *s = src + (size_t)r * ld + (size_t)h * hd;
            uint16_t *d = dst + ((size_t)h * rows + r) * hd;
#pragma omp simd
            for (int j = 0; j < hd; j++) d[j] = bf16_select(s[j]);
        }
}

/* the same from a bf16 cache (--kv-dtype bf16): its elements are what
 * the products read already, so they are copied, never widened and
 * rounded back */
static void to_heads_bf16(uint16_t *dst, const uint16_t *src, int rows, int heads, int hd)
{
    const size_t ld = (size_t)heads * hd;
#pragma omp parallel for schedule(static) if ((size_t)rows * ld > 65536)
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++)
            memcpy(dst + ((size_t)h * rows + r) * hd, src + (size_t)r * ld + (size_t)h * hd, (size_t)hd * sizeof *dst);
}

/* cp_f32_to_bf16 without its NaN branch, which kept the loop below from
 * vectorizing: cpu_exp_nonpos never returns a NaN (it clamps its argument
 * first), so the rounding is the same */
static inline uint16_t bf16_of_finite(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__x86_64__)
#include <immintrin.h>

#include "exp_avx512.h"

/* One row of exp_rows on AVX-512 (the fallback below is its definition):
 * returns the sum of the row's rounded values */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static float exp_row_avx512(const float *row, uint16_t *p, const int32_t *kp, int nk,
                                                                        int32_t qp, int32_t lo)
{
    const __m512i vq = _mm512_set1_epi32(qp), vlo = _mm512_set1_epi32(lo);
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512i k = _mm512_maskz_loadu_epi32(in, kp + j);
        const __mmask16 vis = in & _mm512_cmple_epi32_mask(k, vq) & _mm512_cmpgt_epi32_mask(k, vlo);
        vmx = _mm512_mask_max_ps(vmx, vis, vmx, _mm512_maskz_loadu_ps(vis, row + j)); /* a NaN score is never the max, as in C */
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 in = nk - j >= 16 ? 0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512i k = _mm512_maskz_loadu_epi32(in, kp + j);
        const __mmask16 vis = in & _mm512_cmple_epi32_mask(k, vq) & _mm512_cmpgt_epi32_mask(k, vlo);
        const __m512 e = cp_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(vis, row + j), mx));
        __m512i u = _mm512_castps_si512(e); /* bf16_of_finite */
        u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
        u = _mm512_maskz_srli_epi32(vis, u, 16);
        _mm256_mask_storeu_epi16(p + j, in, _mm512_cvtepi32_epi16(u));
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)));
    }
    return _mm512_reduce_add_ps(sum);
}
#endif

/* The softmax without export or sensitive mass, fused with the rounding
 * (rows: nq rows of one head, or of every head stacked head-major):
 * pb[i][j] = bf16(e^(S[i][j] - max_i)) over the keys row i sees (0 for the
 * rest), inv[i] = 1 / the sum of those rounded values (0 when it sees
 * none), so PV over pb scaled by inv is PV over probabilities that sum to
 * one in the precision PV reads them. */
static void exp_rows(const cp_attn_args *a, const float *S, uint16_t *pb, float *inv, int q0, int nq, int rows, int klo, int nk)
{
#if defined(__x86_64__)
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#endif
#pragma omp parallel for schedule(static) if (rows > 4)
    for (int i = 0; i < rows; i++) { /* rows of heads stacked: row i is query q0 + i % nq */
        const float *row = S + (size_t)i * nk;
        uint16_t *p = pb + (size_t)i * nk;
        const int32_t qp = a->q_pos[q0 + i % nq], *kp = a->k_pos + klo, w = a->window;
        /* both loops in forms the vectorizer takes (this was most of a bf16
         * prefill's attention, scalar): branch-free selects, the maximum
         * a select over -inf for keys the row does not see */
        float mx = -INFINITY, sum = 0;
        const int32_t lo = w ? qp - w : INT32_MIN; /* keys after lo (positions are >= 0) */
#if defined(__x86_64__)
        if (avx512) {
            const float total = exp_row_avx512(row, p, kp, nk, qp, lo);
            inv[i] = total > 0 ? 1.0f / total : 0.0f;
            continue;
        }
#endif
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < nk; j++) {
            const float v = (kp[j] <= qp) & (kp[j] > lo) ? row[j] : -INFINITY;
            mx = v > mx ? v : mx;
        }
#pragma omp simd
        for (int j = 0; j < nk; j++) {
            const uint16_t b = bf16_of_finite(cpu_exp_nonpos(row[j] - mx)); /* a key not seen: dropped below */
            p[j] = (kp[j] <= qp) & (kp[j] > lo) ? b : 0;
        }
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < nk; j++) sum += cp_bf16_to_f32(p[j]);
        inv[i] = sum > 0 ? 1.0f / sum : 0.0f;
    }
}

/* Rows of a query block on the fused path, every head at once: two
 * batched products (oneDNN broadcasting each K / V head over its group)
 * and one softmax region per block, where the per-head loop made 2 calls
 * and 2 parallel regions per head and block (14 heads: 56 per 256 rows).
 * 64 rows: a block's scores for 14 heads at 1024 keys are 3.7 MB (in L3),
 * and the causal diagonal's masked half is 32 of every 1024 rows. */
#define FUSED_ROWS 64

static size_t fused_rows(const cp_attn_args *a) { return a->n < FUSED_ROWS ? (size_t)a->n : FUSED_ROWS; }

static cp_status reserve(cp_dnnl_attn *t, const cp_attn_args *a, cp_error *err)
{
    size_t rows = a->n < CPU_ATTN_QBLOCK ? (size_t)a->n : CPU_ATTN_QBLOCK;
    if (fused_rows(a) * a->n_heads > rows) rows = fused_rows(a) * a->n_heads; /* score rows at once, per head or stacked */
    size_t elems = ((size_t)a->n * a->n_heads + 2 * (size_t)a->n_keys * a->n_kv_heads) * a->head_dim + rows * a->n_keys;
    if (elems > t->buf_elems) {
        free(t->buf);
        t->buf_elems = 0;
        if (!(t->buf = malloc(elems * sizeof *t->buf)))
            return cp_fail(err, CP_ENOMEM, "oneDNN attention: out of memory for %zu bf16 operands", elems);
        t->buf_elems = elems;
    }
    size_t sf = rows * a->n_keys + rows; /* the scores and each row's 1 / sum */
    if (!a->out) { /* export_only: the scores of cpu_attn_export_heads heads */
        const size_t e = (size_t)cpu_attn_export_heads(a) * (a->n < CPU_ATTN_QBLOCK ? (size_t)a->n : CPU_ATTN_QBLOCK) * a->n_keys;
        if (e > sf) sf = e;
    }
    if (sf > t->s_floats) {
        free(t->S);
        t->s_floats = 0;
        if (!(t->S = malloc(sf * sizeof *t->S))) return cp_fail(err, CP_ENOMEM, "oneDNN attention: out of memory for %zu scores", sf);
        t->s_floats = sf;
    }
    return CP_OK;
}

/* the rows of the fused block at q0: at most FUSED_ROWS, none past a
 * position FUSED_ROWS beyond q0's (cpu_attn_block_rows' rule: scattered
 * reused positions keep each block's key range tight) */
static int fused_block_rows(const cp_attn_args *a, int q0)
{
    const int lim = a->n - q0 < FUSED_ROWS ? a->n - q0 : FUSED_ROWS;
    int i = 1;
    while (i < lim && a->q_pos[q0 + i] - a->q_pos[q0] < FUSED_ROWS) i++;
    return i;
}

/* The fused softmax's block, every head at once: S[h][i][j] = scale *
 * Q_h . K_g(h) for keys [klo, klo + nk), exp_rows over the 14 x nq rows,
 * out[i][h] = (P_h . V_g(h)) * inv[h][i] -- the per-head loop's
 * arithmetic (each head's products alike, the same rounding), batched. */
static cp_status fused_block(cp_dnnl_attn *t, const cp_attn_args *a, const uint16_t *qb, const uint16_t *kb, const uint16_t *vb,
                             uint16_t *pb, int q0, int nq, int klo, int nk, float scale, cp_error *err)
{
    const int64_t hd = a->head_dim, n = a->n, nkeys = a->n_keys, R = a->n_heads / a->n_kv_heads, qld = (int64_t)a->n_heads * hd;
    const attn_geom qk = { .m = nq, .n = nk, .k = hd, .G = a->n_kv_heads, .R = R,
                           .as = { R * n * hd, n * hd, hd, 1 },
                           .bs = { nkeys * hd, nkeys * hd, 1, hd }, /* K^T: element [d][j] at j * hd + d */
                           .cs = { R * nq * nk, (int64_t)nq * nk, nk, 1 } };
    cp_status rc = gemm_geom(t, QK, &qk, scale, qb + (size_t)q0 * hd, kb + (size_t)klo * hd, t->S, err);
    if (rc) return rc;
    const int rows = a->n_heads * nq;
    float *inv = t->S + (size_t)rows * nk;
    exp_rows(a, t->S, pb, inv, q0, nq, rows, klo, nk);
    const attn_geom pv = { .m = nq, .n = hd, .k = nk, .G = a->n_kv_heads, .R = R,
                           .as = { R * nq * nk, (int64_t)nq * nk, nk, 1 },
                           .bs = { nkeys * hd, nkeys * hd, hd, 1 },
                           .cs = { R * hd, hd, qld, 1 } };
    float *out = a->out + (size_t)q0 * qld;
    if ((rc = gemm_geom(t, PV, &pv, 1.0f, pb, vb + (size_t)klo * hd, out, err))) return rc;
    const int heads = a->n_heads;
#pragma omp parallel for schedule(static) if (nq > 4)
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < heads; h++) {
            const float r = inv[(size_t)h * nq + i];
            float *o = out + (size_t)i * qld + (size_t)h * hd;
            for (int d = 0; d < hd; d++) o[d] *= r;
        }
    return CP_OK;
}

/* A call without output rows (the export and the sensitive mass): the
 * per-head loop's blocks, key ranges and QK^T products (the same calls,
 * so the same primitives and bits), each into its own part of the scores,
 * then one export pass over cpu_attn_export_heads heads at a time -- no V
 * rounding, no probabilities rounded, no PV product. */
static cp_status export_only(cp_dnnl_attn *t, const cp_attn_args *a, const uint16_t *qb, const uint16_t *kb, float scale, cp_error *err)
{
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads, hc = cpu_attn_export_heads(a);
    for (int q0 = 0, nq; q0 < a->n; q0 += nq) {
        nq = cpu_attn_block_rows(a, q0);
        int klo, khi;
        cpu_attn_key_range(a, q0, nq, &klo, &khi);
        if (khi <= klo) continue; /* no key visible to any row: nothing to add */
        const int nk = khi - klo;
        for (int h0 = 0; h0 < a->n_heads; h0 += hc) {
            const int nh = a->n_heads - h0 < hc ? a->n_heads - h0 : hc;
            for (int h = h0; h < h0 + nh; h++) {
                const uint16_t *qh = qb + ((size_t)h * a->n + q0) * hd, *kh = kb + ((size_t)(h / group) * a->n_keys + klo) * hd;
                cp_status rc = gemm(t, QK, nq, nk, hd, scale, qh, kh, t->S + (size_t)(h - h0) * nq * nk, nk, err);
                if (rc) return rc;
            }
            cpu_attn_export_rows(a, t->S, nh, q0, nq, klo, nk);
        }
    }
    return CP_OK;
}

cp_status cp_dnnl_attention(cp_dnnl_attn *t, const cp_attn_args *a, cp_error *err)
{
    const int hd = a->head_dim, qld = a->n_heads * hd, group = a->n_heads / a->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    cp_status rc = reserve(t, a, err);
    if (rc) return rc;
    uint16_t *qb = t->buf, *kb = qb + (size_t)a->n * qld, *vb = kb + (size_t)a->n_keys * a->n_kv_heads * hd;
    uint16_t *pb = vb + (size_t)a->n_keys * a->n_kv_heads * hd;
    to_heads(qb, a->q, a->n, a->n_heads, hd);
    if (a->k16) { /* a bf16 cache: k and v are NULL */
        to_heads_bf16(kb, a->k16, a->n_keys, a->n_kv_heads, hd);
        if (a->out) to_heads_bf16(vb, a->v16, a->n_keys, a->n_kv_heads, hd);
    } else {
        to_heads(kb, a->k, a->n_keys, a->n_kv_heads, hd);
        if (a->out) to_heads(vb, a->v, a->n_keys, a->n_kv_heads, hd);
    }
    if (!a->export_a && !a->sens_mass) {
        for (int q0 = 0, nq; q0 < a->n; q0 += nq) {
            nq = fused_block_rows(a, q0);
            int klo, khi;
            cpu_attn_key_range(a, q0, nq, &klo, &khi);
            if (khi <= klo) { /* no key visible to any row: zeros, as the f32 attention gives */
                for (int i = 0; i < nq; i++) memset(a->out + (size_t)(q0 + i) * qld, 0, (size_t)qld * sizeof(float));
                continue;
            }
            if ((rc = fused_block(t, a, qb, kb, vb, pb, q0, nq, klo, khi - klo, scale, err))) return rc;
        }
        return CP_OK;
    }
    if (!a->out) return export_only(t, a, qb, kb, scale, err);
    for (int q0 = 0, nq; q0 < a->n; q0 += nq) {
        nq = cpu_attn_block_rows(a, q0);
        int klo, khi;
        cpu_attn_key_range(a, q0, nq, &klo, &khi);
        for (int h = 0; h < a->n_heads; h++) {
            float *out = a->out + (size_t)q0 * qld + (size_t)h * hd;
            if (khi <= klo) { /* no key visible to any row: zeros, as the f32 attention gives */
                for (int i = 0; i < nq; i++) memset(out + (size_t)i * qld, 0, (size_t)hd * sizeof(float));
                continue;
            }
            const int nk = khi - klo, g = h / group;
            const uint16_t *qh = qb + ((size_t)h * a->n + q0) * hd;
            const uint16_t *kh = kb + ((size_t)g * a->n_keys + klo) * hd, *vh = vb + ((size_t)g * a->n_keys + klo) * hd;
            if ((rc = gemm(t, QK, nq, nk, hd, scale, qh, kh, t->S, nk, err))) return rc;
            /* the f32 attention's own softmax, for the export and the mass */
            cpu_attn_softmax_rows(a, t->S, q0, nq, klo, nk);
            const size_t np = (size_t)nq * nk;
            const float *S = t->S;
#pragma omp parallel for schedule(static) if (np > 65536)
            for (size_t i = 0; i < np; i++) pb[i] = cp_f32_to_bf16(S[i]);
            if ((rc = gemm(t, PV, nq, hd, nk, 1.0f, pb, vh, out, qld, err))) return rc;
        }
    }
    return CP_OK;
}
