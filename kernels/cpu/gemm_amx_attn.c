/* A prefill's attention on AMX bf16 tiles (gemm_amx.h, cp_amx_attention):
 * Q K^T and P V as tile products, the f32 path's mask and softmax between.
 * Target attributes only (gemm_amx.c). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "../dtype.h"
#include "exp_avx512.h"
#include "gemm_amx_internal.h"
#include "gemm_amx_micro.h"
#include "ops_cpu.h"

/* the 1 x 1 bf16 tile product (gemm_amx_micro.h): Q K^T and P V */
MICRO_1X1(bf16_1x1, DP_BF16)

/* ---- attention ----------------------------------------------------------
 * Per query block (q0, nq rows, key slots [klo, khi) some row sees, klo
 * taken down to a multiple of 32): scratch holds Q staged for every head
 * ([head][nq_pad / 16][hd / 32][16][32] bf16), K packed per KV head as
 * the B operand of Q K^T ([key block of 16][hd / 32][16 dim pairs][16
 * keys][2]), V packed per KV head as the B operand of P V ([dim block of
 * 16][key tile of 32][16 key pairs][16 dims][2]), then per thread the
 * scores (nq_pad x nk f32) and P staged as A tiles ([nq_pad / 16][nk_pad
 * / 32][16][32] bf16). */
static size_t attn_round64(size_t b) { return (b + 63) & ~(size_t)63; }

typedef struct attn_plan {
    int nq_pad, nk_max_pad; /* the largest block's */
    size_t q_bytes, k_bytes, v_bytes, s_bytes, p_bytes;
} attn_plan;

static void attn_plan_of(const cp_attn_args *a, attn_plan *P)
{
    const int hd = a->head_dim;
    P->nq_pad = ((a->n < CPU_ATTN_QBLOCK ? a->n : CPU_ATTN_QBLOCK) + 15) & ~15;
    P->nk_max_pad = ((a->n_keys + 31) & ~31) + 32; /* klo taken down to 32 adds up to 31 slots */
    P->q_bytes = attn_round64((size_t)a->n_heads * P->nq_pad * hd * 2);
    P->k_bytes = attn_round64((size_t)a->n_kv_heads * P->nk_max_pad * hd * 2);
    P->v_bytes = P->k_bytes;
    P->s_bytes = attn_round64((size_t)P->nq_pad * P->nk_max_pad * 4);
    P->p_bytes = attn_round64((size_t)P->nq_pad * P->nk_max_pad * 2);
}

size_t cp_amx_attn_scratch(const cp_attn_args *a, int threads)
{
    attn_plan P;
    attn_plan_of(a, &P);
    return P.q_bytes + P.k_bytes + P.v_bytes + (size_t)threads * (P.s_bytes + P.p_bytes);
}

/* 16 values of row `row` (f32 or bf16 source, element offset off, count
 * valid of them) rounded to bf16 into d */
AMX_FN static void bf16_16(uint16_t *d, const float *f, const uint16_t *h, size_t off, int valid)
{
    const __mmask16 m = valid >= 16 ? (__mmask16)0xffff : valid > 0 ? (__mmask16)((1u << valid) - 1) : 0;
    if (f) _mm256_storeu_si256((__m256i *)(void *)d, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, valid > 0 ? f + off : f)));
    else _mm256_storeu_si256((__m256i *)(void *)d, _mm256_maskz_loadu_epi16(m, valid > 0 ? h + off : h));
}

/* element (r, c) of a bf16 source matrix with row stride ld (f32 or bf16) */
static uint16_t src_bf16(const float *f, const uint16_t *h, size_t at) { return f ? cp_f32_to_bf16(f[at]) : h[at]; }

/* One row's probabilities over slots [klo, klo + nk) in place (S's row of
 * scaled scores): the f32 path's mask (a slot is visible when its position
 * is at most the query's and, with a window, within it) and softmax, with
 * the vector exponential (cp_exp16_nonpos, relative error ~2e-7, far
 * inside the bf16 rounding P gets next) and the sum in 16 f32 lanes by
 * slot modulo 16 -- klo is a multiple of 32, so a slot's lane is the same
 * in every block -- reduced in a fixed order: a row's probabilities do not
 * depend on its block.  No visible slot: zeros, as the f32 path. */
AMX_FN static void attn_softmax_row(const cp_attn_args *a, float *row, int32_t qp, int klo, int nk)
{
    const __m512i vq = _mm512_set1_epi32(qp), vw = _mm512_set1_epi32(qp - a->window);
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 m = nk - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512i kp = _mm512_maskz_loadu_epi32(m, a->k_pos + klo + j);
        __mmask16 vis = _mm512_mask_cmple_epi32_mask(m, kp, vq);
        if (a->window) vis = _mm512_mask_cmpgt_epi32_mask(vis, kp, vw);
        mx = _mm512_mask_max_ps(mx, vis, mx, _mm512_maskz_loadu_ps(m, row + j));
    }
    const float top = _mm512_reduce_max_ps(mx);
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 m = nk - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - j)) - 1);
        const __m512i kp = _mm512_maskz_loadu_epi32(m, a->k_pos + klo + j);
        __mmask16 vis = _mm512_mask_cmple_epi32_mask(m, kp, vq);
        if (a->window) vis = _mm512_mask_cmpgt_epi32_mask(vis, kp, vw);
        const __m512 e = top == -INFINITY ? _mm512_setzero_ps()
                                          : _mm512_maskz_mov_ps(vis, cp_exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), _mm512_set1_ps(top))));
        _mm512_mask_storeu_ps(row + j, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    const float total = _mm512_reduce_add_ps(sum), inv = total > 0 ? 1.0f / total : 0.0f;
    for (int j = 0; j < nk; j += 16) {
        const __mmask16 m = nk - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - j)) - 1);
        _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), _mm512_set1_ps(inv)));
    }
}

AMX_FN static void attn_block(const cp_attn_args *a, const attn_plan *P, char *scratch, int threads, int q0, int nq)
{
    const int hd = a->head_dim, dt = hd / 32, group = a->n_heads / a->n_kv_heads;
    const int qld = a->n_heads * hd, kld = a->n_kv_heads * hd, nqp = (nq + 15) & ~15, nqt = nqp / 16;
    int klo, khi;
    cpu_attn_key_range(a, q0, nq, &klo, &khi);
    if (klo >= khi) { /* no key visible to any row: zeros, as the f32 path */
        for (int i = 0; i < nq; i++) memset(a->out + (size_t)(q0 + i) * qld, 0, (size_t)qld * sizeof(float));
        return;
    }
    klo &= ~31;
    const int nk = khi - klo, nkp = (nk + 31) & ~31, nkb = (nk + 15) / 16, nkt = nkp / 32; /* S: the blocks holding slots; P V: whole tiles */
    const float scale = 1.0f / sqrtf((float)hd);
    uint16_t *qs = (uint16_t *)(void *)scratch, *ks = (uint16_t *)(void *)(scratch + P->q_bytes),
             *vs = (uint16_t *)(void *)(scratch + P->q_bytes + P->k_bytes);
    char *per_thread = scratch + P->q_bytes + P->k_bytes + P->v_bytes;
    const float *kf = a->k16 ? NULL : a->k, *vf = a->k16 ? NULL : a->v;
#pragma omp parallel num_threads(threads)
    {
        /* Q: row i of head h, 32 dims a tile */
#pragma omp for schedule(static) collapse(2)
        for (int h = 0; h < a->n_heads; h++)
            for (int i = 0; i < nqp; i++)
                for (int t = 0; t < dt; t++) {
                    uint16_t *d = qs + ((((size_t)h * nqt + i / 16) * dt + t) * 16 + i % 16) * 32;
                    const size_t off = (size_t)(q0 + i) * qld + (size_t)h * hd + 32 * t;
                    bf16_16(d, a->q, NULL, off, i < nq ? 16 : 0);
                    bf16_16(d + 16, a->q, NULL, off + 16, i < nq ? 16 : 0);
                }
        /* K: key slot klo + j as column j % 16 of key block j / 16, its
         * dims in pairs down the tile; V: dim c as column c % 16 of dim
         * block c / 16, key slots in pairs down the tile (slots past khi
         * zero) */
#pragma omp for schedule(static) collapse(2)
        for (int g = 0; g < a->n_kv_heads; g++)
            for (int j = 0; j < nkp; j++) {
                const int have = j < nk;
                const size_t row = (size_t)(klo + j) * kld + (size_t)g * hd;
                uint16_t *kb = ks + (size_t)g * P->nk_max_pad * hd;
                uint16_t *vb = vs + (size_t)g * P->nk_max_pad * hd;
                for (int c = 0; c < hd; c++) {
                    kb[(((size_t)(j / 16) * dt + c / 32) * 16 + (c % 32) / 2) * 32 + (j % 16) * 2 + c % 2] =
                        have ? src_bf16(kf, a->k16, row + c) : 0;
                    vb[(((size_t)(c / 16) * nkt + j / 32) * 16 + (j % 32) / 2) * 32 + (c % 16) * 2 + j % 2] =
                        have ? src_bf16(vf, a->v16, row + c) : 0;
                }
            }
        const int tid = omp_get_thread_num();
        float *S = (float *)(void *)(per_thread + (size_t)tid * (P->s_bytes + P->p_bytes));
        uint16_t *pa = (uint16_t *)(void *)((char *)S + P->s_bytes);
        char c[1024] __attribute__((aligned(64)));
        int on = 0;
#pragma omp for schedule(static)
        for (int h = 0; h < a->n_heads; h++) {
            if (!on) tiles_on(), on = 1;
            AMX_MEMORY_BARRIER();
            const int g = h / group;
            const char *qa = (const char *)(qs + (size_t)h * nqt * dt * 512);
            const char *kb = (const char *)(ks + (size_t)g * P->nk_max_pad * hd), *vb = (const char *)(vs + (size_t)g * P->nk_max_pad * hd);
            /* S = scale Q K^T: rows of the block against its key slots */
            for (int rt = 0; rt < nqt; rt++)
                for (int b = 0; b < nkb; b++) {
                    bf16_1x1(qa + (size_t)rt * dt * 1024, 64, 1024, kb + (size_t)b * dt * 1024, 64, 1024, dt, NULL, c, NULL, 0, 0);
                    const int rows = nq - 16 * rt < 16 ? nq - 16 * rt : 16, cols = nk - 16 * b < 16 ? nk - 16 * b : 16;
                    for (int r = 0; r < rows; r++) {
                        const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
                        _mm512_mask_storeu_ps(S + (size_t)(16 * rt + r) * nk + 16 * b, m,
                                              _mm512_mul_ps(_mm512_load_ps((const float *)(const void *)c + 16 * r), _mm512_set1_ps(scale)));
                    }
                }
            for (int i = 0; i < nq; i++) attn_softmax_row(a, S + (size_t)i * nk, a->q_pos[q0 + i], klo, nk);
            /* P as A tiles: row i, key slot j (zeros past nk and for rows past nq) */
            for (int i = 0; i < nqp; i++)
                for (int t = 0; t < nkt; t++) {
                    uint16_t *d = pa + (((size_t)(i / 16) * nkt + t) * 16 + i % 16) * 32;
                    const int valid = i < nq ? nk - 32 * t : 0;
                    bf16_16(d, S, NULL, (size_t)i * nk + 32 * t, valid);
                    bf16_16(d + 16, S, NULL, (size_t)i * nk + 32 * t + 16, valid - 16);
                }
            AMX_MEMORY_BARRIER();
            /* O = P V: every key tile in slot order, from zero */
            for (int rt = 0; rt < nqt; rt++)
                for (int db = 0; db < hd / 16; db++) {
                    bf16_1x1((const char *)pa + (size_t)rt * nkt * 1024, 64, 1024, vb + (size_t)db * nkt * 1024, 64, 1024, nkt, NULL, c,
                             NULL, 0, 0);
                    const int rows = nq - 16 * rt < 16 ? nq - 16 * rt : 16;
                    put_f32(a->out + (size_t)(q0 + 16 * rt) * qld + (size_t)h * hd + 16 * db, qld, (const float *)(const void *)c, rows, 16,
                            0);
                }
        }
        if (on) _tile_release();
    }
}

cp_status cp_amx_attention(const cp_attn_args *a, void *scratch, int threads, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s) return s;
    if (a->n < 1 || a->n_keys < 1 || a->head_dim < 32 || a->head_dim % 32 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads ||
        threads < 1)
        return cp_fail(err, CP_EUNSUPPORTED, "amx attention: %d queries, %d keys, head_dim %d (a multiple of 32 wanted), %d / %d heads",
                       a->n, a->n_keys, a->head_dim, a->n_heads, a->n_kv_heads);
    if (a->export_a || a->sens_mass)
        return cp_fail(err, CP_EUNSUPPORTED, "amx attention: the attention export and the sensitive mass are the f32 path's");
    if (!(a->k && a->v) && !(a->k16 && a->v16)) return cp_fail(err, CP_EINVAL, "amx attention: no keys or values");
    attn_plan P;
    attn_plan_of(a, &P);
    for (int q0 = 0; q0 < a->n;) {
        const int nq = cpu_attn_block_rows(a, q0);
        attn_block(a, &P, scratch, threads, q0, nq);
        q0 += nq;
    }
    return CP_OK;
}
