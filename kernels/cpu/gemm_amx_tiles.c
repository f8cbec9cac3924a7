/* The work-item driver both AMX GEMMs run (gemm_amx_internal.h says
 * how items, K chunks and the carried C tiles go), its micro-kernels, and
 * the int8 epilogue.  Target attributes only (gemm_amx.c). */
#include <stddef.h>
#include <stdint.h>

#include "../q8.h"
#include "exp_avx512.h"
#include "gemm_amx_internal.h"
#include "gemm_amx_micro.h"

static const char *col_block(const amx_job *J, int v)
{
    if (J->i8) return J->b + (size_t)(v / 3) * CP_Q8_PANEL_COLS * (size_t)J->ld + (size_t)(v % 3) * 64;
    return J->b + (size_t)v * (size_t)J->kt * 1024;
}

/* a SwiGLU job's items: one column block each (gate's and up's), not a pair */
static int item_cols(const amx_job *J) { return J->h ? J->nblk : (J->nblk + 1) / 2; }

MICRO_2X2(bf16_2x2, DP_BF16)
MICRO_2X1(bf16_2x1, DP_BF16)
MICRO_2X2(i8_2x2, DP_I8)
MICRO_2X1(i8_2x1, DP_I8)
MICRO_1X2(bf16_1x2, DP_BF16)
MICRO_1X1(bf16_1x1, DP_BF16)
MICRO_1X2(i8_1x2, DP_I8)
MICRO_1X1(i8_1x1, DP_I8)

/* a C tile (16 x 16 s32) into y: (float)(acc - 128 sum_j) (s_x[i] s_w[j]),
 * + y when accumulating -- gemm_i8_prefill.c's expression, operation for
 * operation, so the bits are its */
AMX_FN static void put_i8(float *y, int ldy, const int32_t *c, int rows, int cols, const float *sx, const float *sw, const int32_t *sum,
                          int accumulate)
{
    const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    const __m512i bias = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, sum), 7);
    const __m512 swv = _mm512_maskz_loadu_ps(m, sw);
    for (int r = 0; r < rows; r++) {
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(c + 16 * r), bias)),
                                 _mm512_mul_ps(_mm512_set1_ps(sx[r]), swv));
        float *yo = y + (size_t)r * ldy;
        if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), v);
        _mm512_mask_storeu_ps(yo, m, v);
    }
}

/* y[r, 0:cols] += b for rows r < rows (ldy apart): cpu_add_bias's one
 * add an element, after the product is in y */
AMX_FN static void add_bias(float *y, int ldy, const float *b, int rows, int cols)
{
    const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    const __m512 bv = _mm512_maskz_loadu_ps(m, b);
    for (int r = 0; r < rows; r++) {
        float *yo = y + (size_t)r * ldy;
        _mm512_mask_storeu_ps(yo, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), bv));
    }
}

/* The SwiGLU epilogue of one row tile: gate's C tile g and up's u (16 x
 * 16 f32) into 16 rows of 16 bf16 lanes at d, 64 bytes apart --
 * q8p_swiglu_span's cp_silu_mul16 lane for lane, then stage_row's
 * rounding: the bits the staged swiglu source gives. */
AMX_FN static void put_swiglu(char *d, const float *g, const float *u)
{
    for (int r = 0; r < 16; r++) {
        const __m512 s = cp_silu_mul16(_mm512_load_ps(g + 16 * r), _mm512_load_ps(u + 16 * r));
        _mm256_store_si256((__m256i *)(void *)(d + 64 * r), (__m256i)_mm512_cvtneps_pbh(s));
    }
}

/* row pairs [p0, p1) x column item ci (a pair of column blocks, or for
 * SwiGLU one block of gate and of up) over K tiles [k0, k1): the C tiles
 * carried in cb (4 a row pair) from K tile 0 up to k0 and on past k1; the
 * chunk that ends K puts them out through the epilogue */
AMX_FN static void run_span(const amx_job *J, int ci, int p0, int p1, int k0, int k1, char *cb, char *c)
{
    const int one = one_tile(J->n), glu = J->h != NULL;
    const int v0 = glu ? ci : 2 * ci, two = glu || v0 + 1 < J->nblk;
    const char *b0 = col_block(J, v0), *b1 = glu ? J->b_up + (size_t)v0 * (size_t)J->kt * 1024 : two ? col_block(J, v0 + 1) : NULL;
    for (int t0 = k0; t0 < k1; t0 += KC_TILES) {
        const int ntk = k1 - t0 < KC_TILES ? k1 - t0 : KC_TILES, last = t0 + ntk == J->kt;
        for (int p = p0; p < p1; p++) {
            const char *a0 = J->a + (size_t)(2 * p) * J->a_rt + (size_t)t0 * J->a_kt, *a1 = one ? a0 : a0 + J->a_rt;
            const char *bb0 = b0 + (size_t)t0 * J->b_kt, *bb1 = two ? b1 + (size_t)t0 * J->b_kt : NULL;
            const char *cin = t0 ? cb + (size_t)(p - p0) * 4096 : NULL;
            char *cout = last ? c : cb + (size_t)(p - p0) * 4096;
            const int r0 = 32 * p, rows = J->n - r0 < 32 ? J->n - r0 : 32;
            const char *pf = last && !glu ? (const char *)(J->y + (size_t)r0 * J->ldy + 16 * v0) : NULL;
            const int pfrows = pf ? rows : 0;
            const size_t ldpf = (size_t)J->ldy * 4;
            if (J->i8) {
                if (one && two) i8_1x2(a0, J->lda, J->a_kt, bb0, bb1, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                else if (one) i8_1x1(a0, J->lda, J->a_kt, bb0, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                else if (two) i8_2x2(a0, a1, J->lda, J->a_kt, bb0, bb1, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                else i8_2x1(a0, a1, J->lda, J->a_kt, bb0, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
            } else {
                if (one && two) bf16_1x2(a0, J->lda, J->a_kt, bb0, bb1, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                else if (one) bf16_1x1(a0, J->lda, J->a_kt, bb0, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                else if (two) bf16_2x2(a0, a1, J->lda, J->a_kt, bb0, bb1, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
                else bf16_2x1(a0, a1, J->lda, J->a_kt, bb0, J->ldb, J->b_kt, ntk, cin, cout, pf, ldpf, pfrows);
            }
            if (!last) continue;
            if (glu) { /* every row of the unit's tiles: rows past n are zeros in A, so 0 here */
                for (int h = 0; h < 2 - one; h++)
                    put_swiglu(J->h + (size_t)(2 * p + h) * J->h_rt + (size_t)(v0 / 2) * 1024 + (size_t)(v0 % 2) * 32,
                               (const float *)(const void *)(c + (size_t)(2 * h) * 1024), (const float *)(const void *)(c + (size_t)(2 * h + 1) * 1024));
                continue;
            }
            for (int h = 0; h < 2 && 16 * h < rows; h++) {
                const int rr = rows - 16 * h < 16 ? rows - 16 * h : 16;
                for (int v = 0; v < 1 + two; v++) {
                    const int j0 = 16 * (v0 + v), cols = J->out - j0 < 16 ? J->out - j0 : 16;
                    float *yo = J->y + (size_t)(r0 + 16 * h) * J->ldy + j0;
                    const char *ct = c + (size_t)(2 * h + v) * 1024;
                    if (J->i8)
                        put_i8(yo, J->ldy, (const int32_t *)(const void *)ct, rr, cols, J->sx + r0 + 16 * h, J->sw + j0, J->sum + j0,
                               J->accumulate);
                    else put_f32(yo, J->ldy, (const float *)(const void *)ct, rr, cols, J->accumulate);
                    if (J->bias) add_bias(yo, J->ldy, J->bias + j0, rr, cols);
                }
            }
        }
    }
}

/* work item it of J (a block of row pairs x a column item): all of K */
AMX_FN static void run_item(const amx_job *J, long it, char *cb, char *c)
{
    const int pairs = row_units(J->n), ncp = item_cols(J), mb = (int)(it / ncp);
    const int p0 = mb * J->bp, p1 = p0 + J->bp < pairs ? p0 + J->bp : pairs;
    run_span(J, (int)(it % ncp), p0, p1, 0, J->kt, cb, c);
}

/* thread t of nt in K segments (KSEG_TILES): its run of the column items,
 * for each row block, each segment, each of its items */
AMX_FN static void run_ksegs(const amx_job *J, int t, int nt, char *cb, char *c)
{
    const int pairs = row_units(J->n), ncp = item_cols(J), c0 = (int)((long)ncp * t / nt), c1 = (int)((long)ncp * (t + 1) / nt);
    for (int p0 = 0; p0 < pairs; p0 += J->bp) {
        const int p1 = p0 + J->bp < pairs ? p0 + J->bp : pairs;
        for (int k0 = 0; k0 < J->kt; k0 += J->kseg)
            for (int ci = c0; ci < c1; ci++)
                run_span(J, ci, p0, p1, k0, k0 + J->kseg < J->kt ? k0 + J->kseg : J->kt, cb + (size_t)(ci - c0) * (size_t)J->bp * 4096, c);
    }
}

cp_status cpu_amx_check_source(const q8p_src *src, int count, const char *what, cp_error *err)
{
    if (count < 1 || count > Q8P_MAX_OUTS || !src || !src->x || (src->kind == Q8P_SRC_NORM && !src->norm_w) ||
        (src->kind == Q8P_SRC_SWIGLU && !src->up))
        return cp_fail(err, CP_EINVAL, "%s: %d outputs (1..%d), or a source without its rows", what, count, Q8P_MAX_OUTS);
    return CP_OK;
}

static long job_items(const amx_job *J) { return (long)((row_units(J->n) + J->bp - 1) / J->bp) * item_cols(J); }

AMX_FN void cpu_amx_run_jobs(const amx_job *J, int count, int t, int nt, char *cb)
{
    long first[Q8P_MAX_OUTS + 1]; /* job o's items are [first[o], first[o + 1]) of the count */
    first[0] = 0;
    for (int o = 0; o < count; o++) first[o + 1] = first[o] + job_items(&J[o]);
    const long items = first[count], i0 = items * t / nt, i1 = items * (t + 1) / nt;
    if (!J->claim && !J->kseg && i0 >= i1) return;
    char c[4096] __attribute__((aligned(64)));
    tiles_on();
    AMX_MEMORY_BARRIER();
    if (J->kseg) run_ksegs(J, t, nt, cb, c); /* one job, fixed runs (amx_job.kseg) */
    else if (J->claim) {
#pragma omp for schedule(dynamic, 1) nowait
        for (long it = 0; it < items; it++) {
            int o = 0;
            while (it >= first[o + 1]) o++;
            run_item(&J[o], it - first[o], cb, c);
        }
    } else
        for (long it = i0, o = 0; it < i1; it++) {
            while (it >= first[o + 1]) o++;
            run_item(&J[o], it - first[o], cb, c);
        }
    _tile_release();
}
