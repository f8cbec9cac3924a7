/* bf16 attention through oneDNN matmul (attn_dnnl.h).  The layout it
 * builds once per call: Q, K and V in bf16, head-major and dense
 * ([head][row][head_dim]), so every per-head matmul reads plain dense
 * operands oneDNN's brgemm takes directly (strided views of the f32 rows
 * would not be), and a K/V head is rounded once for the group of query
 * heads that share it. */
#include "attn_dnnl.h"

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "../dtype.h"
#include "ops_cpu.h"

#define ATTN_CACHE 32

enum { QK = 1, PV = 2 };

typedef struct attn_prim {
    int kind, m, n, k, ldd; /* the key; kind 0: empty */
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

/* C[m, n] (f32, row stride ldd) = scale * A[m, k] . B[k, n], A bf16 dense;
 * B bf16 dense as B^T [n, k] for QK (the K rows) or as B [k, n] for PV
 * (the V rows). */
static cp_status make_prim(cp_dnnl_attn *t, attn_prim *e, int kind, int m, int n, int k, int ldd, float scale, cp_error *err)
{
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = { m, k }, bd = { k, n }, cd = { m, n }, cs = { ldd, 1 };
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&amd, 2, ad, dnnl_bf16, dnnl_ab);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&bmd, 2, bd, dnnl_bf16, kind == QK ? dnnl_ba : dnnl_ab);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs);
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd);
    if (s == dnnl_success) s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success && scale != 1.0f) s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &scale);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, attr, t->eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&e->prim, pd);
    if (s == dnnl_success) s = dnnl_memory_create(&e->src, &amd, t->eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&e->wei, &bmd, t->eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&e->dst, &cmd, t->eng, DNNL_MEMORY_NONE);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) {
        prim_clear(e);
        return cp_fail(err, CP_EUNSUPPORTED, "oneDNN attention: no bf16 matmul for the %s product [%d x %d] x [%d x %d] (status %d)",
                       kind == QK ? "QK^T" : "PV", m, k, k, n, (int)s);
    }
    *e = (attn_prim){ kind, m, n, k, ldd, scale, e->prim, e->src, e->wei, e->dst };
    return CP_OK;
}

static cp_status gemm(cp_dnnl_attn *t, int kind, int m, int n, int k, float scale, const uint16_t *A, const uint16_t *B, float *C,
                      int ldd, cp_error *err)
{
    attn_prim *e = NULL;
    for (int i = 0; i < ATTN_CACHE && !e; i++) {
        attn_prim *c = &t->cache[i];
        if (c->kind == kind && c->m == m && c->n == n && c->k == k && c->ldd == ldd && c->scale == scale) e = c;
    }
    if (!e) {
        for (int i = 0; i < ATTN_CACHE && !e; i++)
            if (!t->cache[i].kind) e = &t->cache[i];
        if (!e) { /* full: round robin (a prefill's shapes repeat over its layers) */
            e = &t->cache[t->next_evict];
            t->next_evict = (t->next_evict + 1) % ATTN_CACHE;
            prim_clear(e);
        }
        cp_status rc = make_prim(t, e, kind, m, n, k, ldd, scale, err);
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

/* dst[h][r][d] = bf16(src[r * ld + h * hd + d]): rows x heads of hd */
static void to_heads(uint16_t *dst, const float *src, int rows, int heads, int hd)
{
    const size_t ld = (size_t)heads * hd;
#pragma omp parallel for schedule(static) if ((size_t)rows * ld > 65536)
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++) {
            const float *s = src + (size_t)r * ld + (size_t)h * hd;
            uint16_t *d = dst + ((size_t)h * rows + r) * hd;
            for (int j = 0; j < hd; j++) d[j] = cp_f32_to_bf16(s[j]);
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

/* The softmax without export or sensitive mass, fused with the rounding:
 * pb[i][j] = bf16(e^(S[i][j] - max_i)) over the keys row i sees (0 for the
 * rest), inv[i] = 1 / the sum of those rounded values (0 when it sees
 * none), so PV over pb scaled by inv is PV over probabilities that sum to
 * one in the precision PV reads them. */
static void exp_rows(const cp_attn_args *a, const float *S, uint16_t *pb, float *inv, int q0, int nq, int klo, int nk)
{
#if defined(__x86_64__)
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#endif
#pragma omp parallel for schedule(static) if (nq > 4)
    for (int i = 0; i < nq; i++) {
        const float *row = S + (size_t)i * nk;
        uint16_t *p = pb + (size_t)i * nk;
        const int32_t qp = a->q_pos[q0 + i], *kp = a->k_pos + klo, w = a->window;
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

static cp_status reserve(cp_dnnl_attn *t, const cp_attn_args *a, cp_error *err)
{
    size_t rows = a->n < CPU_ATTN_QBLOCK ? (size_t)a->n : CPU_ATTN_QBLOCK;
    size_t elems = ((size_t)a->n * a->n_heads + 2 * (size_t)a->n_keys * a->n_kv_heads) * a->head_dim + rows * a->n_keys;
    if (elems > t->buf_elems) {
        free(t->buf);
        t->buf_elems = 0;
        if (!(t->buf = malloc(elems * sizeof *t->buf)))
            return cp_fail(err, CP_ENOMEM, "oneDNN attention: out of memory for %zu bf16 operands", elems);
        t->buf_elems = elems;
    }
    size_t sf = rows * a->n_keys + rows; /* the scores and each row's 1 / sum */
    if (sf > t->s_floats) {
        free(t->S);
        t->s_floats = 0;
        if (!(t->S = malloc(sf * sizeof *t->S))) return cp_fail(err, CP_ENOMEM, "oneDNN attention: out of memory for %zu scores", sf);
        t->s_floats = sf;
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
        to_heads_bf16(vb, a->v16, a->n_keys, a->n_kv_heads, hd);
    } else {
        to_heads(kb, a->k, a->n_keys, a->n_kv_heads, hd);
        to_heads(vb, a->v, a->n_keys, a->n_kv_heads, hd);
    }
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
            if (!a->export_a && !a->sens_mass) { /* the fused softmax: PV over e^(s - max), rows scaled after */
                float *inv = t->S + (size_t)nq * nk;
                exp_rows(a, t->S, pb, inv, q0, nq, klo, nk);
                if ((rc = gemm(t, PV, nq, hd, nk, 1.0f, pb, vh, out, qld, err))) return rc;
#pragma omp parallel for schedule(static) if (nq > 4)
                for (int i = 0; i < nq; i++)
                    for (int d = 0; d < hd; d++) out[(size_t)i * qld + d] *= inv[i];
                continue;
            }
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
