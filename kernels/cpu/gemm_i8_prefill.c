/* The int8 prefill GEMM on AVX-512 VNNI (gemm_i8_prefill.h says why and
 * what it computes).  Compiled with target attributes only: the same
 * binary runs on CPUs without AVX-512, where the backend never calls it. */
#include "gemm_i8_prefill.h"

#include <immintrin.h>
#include <omp.h>
#include <string.h>

#include "../q8.h"

#define VNNI_TARGET "avx512f,avx512bw,avx512vl,avx512vnni"

int q8p_takes(q8_isa k, int n) { return k == Q8_VNNI && n > Q8P_MIN_ROWS; }

/* scratch: n scales (64-aligned), n quantized rows of ld bytes, then one
 * panel of Q8P_PANEL x ld bytes per thread */
static size_t panel_bytes(int in) { return (size_t)Q8P_PANEL * (size_t)cp_q8_ld(in); }

size_t q8p_scratch(int n, int in, int threads)
{
    return cp_q8_round64((size_t)n * 4) + (size_t)n * (size_t)cp_q8_ld(in) + (size_t)threads * panel_bytes(in);
}

/* Panel p of W into dst: columns j0 .. j0 + Q8P_PANEL (those past out
 * zero), as [ld / 4][Q8P_NV][16 columns][4 bytes].  One gather takes the
 * same 4 bytes of 16 rows: vector v of k-group g is 16 dwords at
 * w[j0 + 16 v + c][4 g]. */
__attribute__((target(VNNI_TARGET))) static void pack_panel(int8_t *dst, const int8_t *q, int ld, int j0, int out)
{
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_mullo_epi32(lane, _mm512_set1_epi32(ld));
    __mmask16 m[Q8P_NV];
    for (int v = 0; v < Q8P_NV; v++) {
        int left = out - (j0 + 16 * v);
        m[v] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    }
    const int groups = ld / 4;
    for (int v = 0; v < Q8P_NV; v++) {
        const int8_t *src = q + (size_t)(j0 + 16 * v) * ld;
        int8_t *d = dst + (size_t)v * 64;
        if (!m[v]) {
            for (int g = 0; g < groups; g++) _mm512_store_si512(d + (size_t)g * Q8P_PANEL * 4, _mm512_setzero_si512());
            continue;
        }
        for (int g = 0; g < groups; g++)
            _mm512_store_si512(d + (size_t)g * Q8P_PANEL * 4,
                               _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m[v], idx, src + 4 * g, 1));
    }
}

/* R rows (a constant in each instantiation: the accumulators stay in
 * registers) of quantized x at a (row stride ld) against one packed
 * panel: y's columns j0 .. j0 + Q8P_PANEL, those past out masked off. */
__attribute__((target(VNNI_TARGET), always_inline)) static inline void tile(int R, const uint8_t *a, int ld, const int8_t *b,
                                                                             float *y, int ldy, const float *sx, const float *sw,
                                                                             const int32_t *sum, int j0, int out, int accumulate)
{
    __m512i c[Q8P_MR][Q8P_NV];
#pragma GCC unroll 8
    for (int r = 0; r < Q8P_MR; r++)
#pragma GCC unroll 3
        for (int v = 0; v < Q8P_NV; v++) c[r][v] = _mm512_setzero_si512();
    const int groups = ld / 4;
    for (int g = 0; g < groups; g++) {
        const int8_t *bg = b + (size_t)g * Q8P_PANEL * 4;
        __m512i b0 = _mm512_load_si512(bg), b1 = _mm512_load_si512(bg + 64), b2 = _mm512_load_si512(bg + 128);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32_t s;
            memcpy(&s, a + (size_t)r * ld + 4 * g, 4);
            __m512i av = _mm512_set1_epi32(s);
            c[r][0] = _mm512_dpbusd_epi32(c[r][0], av, b0);
            c[r][1] = _mm512_dpbusd_epi32(c[r][1], av, b1);
            c[r][2] = _mm512_dpbusd_epi32(c[r][2], av, b2);
        }
    }
    /* y = (float)(acc - 128 * rowsum) * (s_x * s_w): gemm_i8.c's expression */
#pragma GCC unroll 3
    for (int v = 0; v < Q8P_NV; v++) {
        int j = j0 + 16 * v, left = out - j;
        if (left <= 0) break;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512i bias = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, sum + j), 7);
        __m512 swv = _mm512_maskz_loadu_ps(m, sw + j);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 val = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c[r][v], bias)), _mm512_mul_ps(_mm512_set1_ps(sx[r]), swv));
            float *yo = y + (size_t)r * ldy + j;
            if (accumulate) val = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), val);
            _mm512_mask_storeu_ps(yo, m, val);
        }
    }
}

#define TILE_CASE(R) \
    case R: tile(R, a, ld, b, y, ldy, sx, sw, sum, j0, out, accumulate); break;
__attribute__((target(VNNI_TARGET))) static void tile_rows(int r, const uint8_t *a, int ld, const int8_t *b, float *y, int ldy,
                                                           const float *sx, const float *sw, const int32_t *sum, int j0, int out,
                                                           int accumulate)
{
    switch (r) {
    TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7)
    default: tile(Q8P_MR, a, ld, b, y, ldy, sx, sw, sum, j0, out, accumulate); break;
    }
}
#undef TILE_CASE

/* Rows in blocks of this many per work item: a block's quantized rows
 * (<= 256 x ld bytes) stay in L2 beside the panel while it runs; enough
 * items that two threads split even the 128-column K / V projections. */
#define ROW_BLOCK 256

__attribute__((target(VNNI_TARGET))) void q8p_gemm(float *y, int ldy, const float *x, const void *w, int n, int in, int out,
                                                   int accumulate, void *scratch, int threads)
{
    const int ld = cp_q8_ld(in);
    float *sx = scratch;
    uint8_t *xq = (uint8_t *)scratch + cp_q8_round64((size_t)n * 4);
    int8_t *panels = (int8_t *)xq + (size_t)n * ld;
    const int8_t *q = cp_q8_data(w);
    const float *sw = cp_q8_scales(w);
    const int32_t *sum = cp_q8_sums(w);
    const int np = (out + Q8P_PANEL - 1) / Q8P_PANEL, nb = (n + ROW_BLOCK - 1) / ROW_BLOCK;
    const long items = (long)np * nb;
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++) sx[i] = q8_quantize_row_u8(x + (size_t)i * in, in, ld, xq + (size_t)i * ld);
        /* contiguous items per thread, panel-major: a thread packs each of
         * its panels once (one shared at the boundary is packed by both) */
        int8_t *pb = panels + (size_t)t * panel_bytes(in);
        long i0 = items * t / nt, i1 = items * (t + 1) / nt;
        int have = -1;
        for (long it = i0; it < i1; it++) {
            int p = (int)(it / nb), blk = (int)(it % nb);
            if (p != have) pack_panel(pb, q, ld, p * Q8P_PANEL, out), have = p;
            int r1 = (blk + 1) * ROW_BLOCK < n ? (blk + 1) * ROW_BLOCK : n;
            for (int r0 = blk * ROW_BLOCK; r0 < r1; r0 += Q8P_MR) {
                int r = r1 - r0 < Q8P_MR ? r1 - r0 : Q8P_MR;
                tile_rows(r, xq + (size_t)r0 * ld, ld, pb, y + (size_t)r0 * ldy, ldy, sx + r0, sw, sum, p * Q8P_PANEL, out, accumulate);
            }
        }
    }
}

/* 20 independent vpdpbusd chains on registers (more than its latency
 * times its issue rate, fewer than the registers), in assembly: gcc kept
 * an intrinsics version's accumulators on the stack */
__attribute__((target(VNNI_TARGET), noinline)) static double peak_loop(long iters)
{
    long n = iters;
    __asm__ volatile("vpternlogd $0xff, %%zmm0, %%zmm0, %%zmm0\n\t"
                     "vpabsb %%zmm0, %%zmm1\n\t"
                     "1:\n\t"
                     "vpdpbusd %%zmm1, %%zmm0, %%zmm2\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm3\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm4\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm5\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm6\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm7\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm8\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm9\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm10\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm11\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm12\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm13\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm14\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm15\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm16\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm17\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm18\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm19\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm20\n\t"
                         "vpdpbusd %%zmm1, %%zmm0, %%zmm21\n\t"
                         "dec %0\n\t"
                         "jnz 1b"
                     : "+r"(n)
                     :
                     : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
                       "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21");
    return (double)iters * 20 * 64;
}

double q8p_peak_ops(int threads, double seconds)
{
    /* best of 8 short runs (a shared machine preempts some), each about
     * seconds / 8, its length calibrated on one thread first */
    const long probe = 1 << 18;
    double t0 = omp_get_wtime();
    peak_loop(probe);
    double dt = omp_get_wtime() - t0;
    long iters = dt > 0 ? (long)(probe * seconds / 8 / dt) : probe;
    if (iters < probe) iters = probe;
    double best = 0;
    for (int rep = 0; rep < 8; rep++) {
        double macs = 0;
        t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : macs)
        macs += peak_loop(iters);
        dt = omp_get_wtime() - t0;
        if (dt > 0 && macs / dt > best) best = macs / dt;
    }
    return best;
}

/* e^x on 16 lanes (cp_exp16: clamped to [-87, 88], relative error ~2e-7),
 * the one copy the CPU kernels share; included here, where its twin was
 * defined, to keep this file's other parts as they are */
#include "exp_avx512.h"

__attribute__((target("avx512f"))) void q8p_swiglu(float *out, const float *gate, const float *up, size_t count)
{
    const size_t blocks = (count + 15) / 16;
#pragma omp parallel for schedule(static) if (count > 4096)
    for (size_t b = 0; b < blocks; b++) {
        size_t i = b * 16, left = count - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        __m512 e = cp_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u));
    }
}
