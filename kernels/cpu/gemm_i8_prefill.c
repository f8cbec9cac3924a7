/* The int8 prefill GEMM on AVX-512 VNNI (gemm_i8_prefill.h says why and
 * what it computes).  Compiled with target attributes only: the same
 * binary runs on CPUs without AVX-512, where the backend never calls it. */
#include "gemm_i8_prefill.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "../q8.h"
#include "peak_rate.h"

#define VNNI_TARGET "avx512f,avx512bw,avx512vl,avx512vnni"

/* a packed matrix's panel is this kernel's tile width */
_Static_assert(Q8P_PANEL == CP_Q8_PANEL_COLS, "q8.h's panel width is the tile's Q8P_NV vectors of 16 columns");

int q8p_takes(q8_isa k, int n) { return k == Q8_VNNI && n > Q8P_MIN_ROWS; }

int q8p_takes_w(q8_isa k, int n, const void *w) { return k == Q8_VNNI && (n > Q8P_MIN_ROWS || cp_q8_layout(w) == CP_Q8_PANELS); }

/* scratch: n scales (64-aligned), n quantized rows of ld bytes, one panel
 * of Q8P_PANEL x ld bytes per thread, then one f32 row (ld floats) per
 * thread for a fused row source (q8p_run) */
static size_t panel_bytes(int in) { return (size_t)Q8P_PANEL * (size_t)cp_q8_ld(in); }
static size_t row_bytes(int in) { return (size_t)cp_q8_ld(in) * sizeof(float); }

size_t q8p_scratch(int n, int in, int threads)
{
    return cp_q8_round64((size_t)n * 4) + (size_t)n * (size_t)cp_q8_ld(in) + (size_t)threads * (panel_bytes(in) + row_bytes(in));
}

/* 16 x 16 dwords transposed in registers: r[c] holds row c's dwords
 * 0..15 on entry, dword e of every row on return (unpack 32, unpack 64,
 * then two 128-bit lane shuffles) */
__attribute__((target(VNNI_TARGET), always_inline)) static inline void transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* u[4i + m], 128-bit lane L: rows 4i..4i+3 of dword 4L + m */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; m++) { /* dword 4L + m: lane L of u[m], u[4 + m], u[8 + m], u[12 + m] */
        __m512i s0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), s1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xee);
        __m512i s2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44), s3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xee);
        r[m] = _mm512_shuffle_i32x4(s0, s2, 0x88);
        r[4 + m] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
        r[8 + m] = _mm512_shuffle_i32x4(s1, s3, 0x88);
        r[12 + m] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
    }
}

/* Panel p of W into dst: columns j0 .. j0 + Q8P_PANEL (those past out
 * zero), as [ld / 4][Q8P_NV][16 columns][4 bytes]: vector v of k-group g
 * is 16 dwords at w[j0 + 16 v + c][4 g].  Why a transpose of 16 rows x 64
 * contiguous bytes and not one vpgatherdd per vector (as before): the
 * gathers, 16 cache lines each, were ~11 % of the prefill GEMMs' time
 * (perf on prof_batch --prefill 1024); rows past out are never read. */
__attribute__((target(VNNI_TARGET))) static void pack_panel(int8_t *dst, const int8_t *q, int ld, int j0, int out)
{
    for (int v = 0; v < Q8P_NV; v++) {
        const int left = out - (j0 + 16 * v), rows = left >= 16 ? 16 : left > 0 ? left : 0;
        const int8_t *src = q + (size_t)(j0 + 16 * v) * ld;
        int8_t *d = dst + (size_t)v * 64;
        for (int k = 0; k < ld; k += 64) { /* ld is a multiple of 64: 16 k-groups at a time */
            __m512i r[16];
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) r[c] = c < rows ? _mm512_loadu_si512(src + (size_t)c * ld + k) : _mm512_setzero_si512();
            transpose16(r);
#pragma GCC unroll 16
            for (int e = 0; e < 16; e++) _mm512_store_si512(d + (size_t)(k / 4 + e) * Q8P_PANEL * 4, r[e]);
        }
    }
}

/* R rows and NV vectors of 16 columns (constants in each instantiation:
 * the accumulators stay in registers) of quantized x at a (row stride ld)
 * against NV adjacent vectors of a packed panel starting at b (k-group
 * stride Q8P_PANEL * 4 bytes): y's columns j0 .. j0 + 16 NV, those past
 * out masked off. */
__attribute__((target(VNNI_TARGET), always_inline)) static inline void tile(int R, int NV, const uint8_t *a, int ld, const int8_t *b, const int8_t *pf,
                                                                             float *y, int ldy, const float *sx, const float *sw,
                                                                             const int32_t *sum, const float *bias_f, int j0, int out,
                                                                             int accumulate)
{
    __m512i c[Q8P_MR][Q8P_NV];
#pragma GCC unroll 8
    for (int r = 0; r < Q8P_MR; r++)
#pragma GCC unroll 3
        for (int v = 0; v < Q8P_NV; v++) c[r][v] = _mm512_setzero_si512();
    const int groups = ld / 4;
    int g = 0;
    if (R == 1) { /* decode: a second chain over k (odd groups into c[1]) so 6, not 3, vpdpbusd are in flight; ld / 4 is even */
        for (; g < groups; g += 2) {
            const int8_t *bg = b + (size_t)g * Q8P_PANEL * 4;
            int32_t s0, s1;
            memcpy(&s0, a + 4 * g, 4);
            memcpy(&s1, a + 4 * g + 4, 4);
            __m512i a0 = _mm512_set1_epi32(s0), a1 = _mm512_set1_epi32(s1);
#pragma GCC unroll 3
            for (int v = 0; v < NV; v++) {
                c[0][v] = _mm512_dpbusd_epi32(c[0][v], a0, _mm512_load_si512(bg + 64 * v));
                c[1][v] = _mm512_dpbusd_epi32(c[1][v], a1, _mm512_load_si512(bg + Q8P_PANEL * 4 + 64 * v));
            }
        }
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++) c[0][v] = _mm512_add_epi32(c[0][v], c[1][v]); /* integers: the same sum in any order */
    }
    for (; g < groups; g++) {
        const int8_t *bg = b + (size_t)g * Q8P_PANEL * 4;
        if (pf) { /* the next panel on its way to L2 while this one computes: its first tile would wait on DRAM */
            _mm_prefetch((const char *)(pf + (size_t)g * Q8P_PANEL * 4), _MM_HINT_T1);
            _mm_prefetch((const char *)(pf + (size_t)g * Q8P_PANEL * 4 + 64), _MM_HINT_T1);
            _mm_prefetch((const char *)(pf + (size_t)g * Q8P_PANEL * 4 + 128), _MM_HINT_T1);
        }
        __m512i bv[Q8P_NV];
#pragma GCC unroll 3
        for (int v = 0; v < NV; v++) bv[v] = _mm512_load_si512(bg + 64 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32_t s;
            memcpy(&s, a + (size_t)r * ld + 4 * g, 4);
            __m512i av = _mm512_set1_epi32(s);
#pragma GCC unroll 3
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_dpbusd_epi32(c[r][v], av, bv[v]);
        }
    }
    /* y = (float)(acc - 128 * rowsum) * (s_x * s_w): gemm_i8.c's expression;
     * then + y (accumulate), then + bias: cpu_add_bias's order after it */
#pragma GCC unroll 3
    for (int v = 0; v < NV; v++) {
        int j = j0 + 16 * v, left = out - j;
        if (left <= 0) break;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512i bias = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, sum + j), 7);
        __m512 swv = _mm512_maskz_loadu_ps(m, sw + j), bv = bias_f ? _mm512_maskz_loadu_ps(m, bias_f + j) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 val = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c[r][v], bias)), _mm512_mul_ps(_mm512_set1_ps(sx[r]), swv));
            float *yo = y + (size_t)r * ldy + j;
            if (accumulate) val = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), val);
            if (bias_f) val = _mm512_add_ps(val, bv);
            _mm512_mask_storeu_ps(yo, m, val);
        }
    }
}

#define TILE_CASE(R, NV) \
    case (R - 1) * Q8P_NV + NV - 1: tile(R, NV, a, ld, b, pf, y, ldy, sx, sw, sum, bias, j0, out, accumulate); break;
#define TILE_ROW(R) TILE_CASE(R, 1) TILE_CASE(R, 2) TILE_CASE(R, 3)
/* r in 1..Q8P_MR rows, nv in 1..Q8P_NV vectors */
__attribute__((target(VNNI_TARGET))) static void tile_rows(int r, int nv, const uint8_t *a, int ld, const int8_t *b, const int8_t *pf,
                                                           float *y, int ldy, const float *sx, const float *sw, const int32_t *sum,
                                                           const float *bias, int j0, int out, int accumulate)
{
    switch ((r - 1) * Q8P_NV + nv - 1) {
    TILE_ROW(1) TILE_ROW(2) TILE_ROW(3) TILE_ROW(4) TILE_ROW(5) TILE_ROW(6) TILE_ROW(7) TILE_CASE(8, 1) TILE_CASE(8, 2)
    default: tile(Q8P_MR, Q8P_NV, a, ld, b, pf, y, ldy, sx, sw, sum, bias, j0, out, accumulate); break;
    }
}
#undef TILE_ROW
#undef TILE_CASE

/* Rows in blocks of this many per work item: a block's quantized rows
 * (<= 256 x ld bytes) stay in L2 beside the panel while it runs; enough
 * items that two threads split even the 128-column K / V projections. */
#define ROW_BLOCK 256
/* at most this many rows are quantized before the parallel region */
#define Q8P_SERIAL_ROWS 16

__attribute__((target("avx512f"))) const float *q8p_source_row(const q8p_src *src, int i, int in, float *buf)
{
    switch (src->kind) {
    case Q8P_SRC_NORM: q8p_rmsnorm_row(buf, src->x + (size_t)i * in, src->norm_w, in, src->eps); return buf;
    case Q8P_SRC_SWIGLU: q8p_swiglu_span(buf, src->x + (size_t)i * in, src->up + (size_t)i * in, (size_t)in); return buf;
    default: return src->x + (size_t)i * in;
    }
}

/* Panel p of output o (oo): in place where the matrix was packed at load;
 * a row-major one packed into the thread's pb, once per panel it takes
 * (*have, *have_o: the panel pb holds) */
__attribute__((target(VNNI_TARGET))) static const int8_t *panel_of(const q8p_out *oo, int o, int p, int ld, int8_t *pb, int *have,
                                                                   int *have_o)
{
    if (cp_q8_layout(oo->w) == CP_Q8_PANELS) return cp_q8_data(oo->w) + (size_t)p * Q8P_PANEL * ld;
    if (p != *have || o != *have_o) pack_panel(pb, cp_q8_data(oo->w), ld, p * Q8P_PANEL, oo->out), *have = p, *have_o = o;
    return pb;
}

/* Rows [r0, r1) of quantized x against vectors voff .. voff + nv of
 * panel p of output oo (b: the panel, packed at load or by the caller),
 * pf the next panel to prefetch during the first tile (or NULL). */
__attribute__((target(VNNI_TARGET))) static void run_piece(const q8p_out *oo, const int8_t *b, const int8_t *pf, int p, int voff, int nv,
                                                           const uint8_t *xq, const float *sx, int ld, int r0, int r1)
{
    for (int r = r0; r < r1; r += Q8P_MR) {
        int rows = r1 - r < Q8P_MR ? r1 - r : Q8P_MR;
        tile_rows(rows, nv, xq + (size_t)r * ld, ld, b + 64 * voff, r == r0 ? pf : NULL, oo->y + (size_t)r * oo->ldy, oo->ldy, sx + r,
                  cp_q8_scales(oo->w), cp_q8_sums(oo->w), oo->bias, p * Q8P_PANEL + 16 * voff, oo->out, oo->accumulate);
    }
}

__attribute__((target(VNNI_TARGET))) void q8p_run(const q8p_src *src, const q8p_out *outs, int count, int n, int in, void *scratch,
                                                  int threads)
{
    const int ld = cp_q8_ld(in);
    float *sx = scratch;
    uint8_t *xq = (uint8_t *)scratch + cp_q8_round64((size_t)n * 4);
    int8_t *panels = (int8_t *)xq + (size_t)n * ld;
    float *rows = (float *)(void *)(panels + (size_t)threads * panel_bytes(in));
    const int nb = (n + ROW_BLOCK - 1) / ROW_BLOCK;
    /* the work items of every output, in order: output o's panels p x row
     * blocks are items [first[o], first[o + 1]) */
    long first[Q8P_MAX_OUTS + 1];
    first[0] = 0;
    for (int o = 0; o < count; o++) first[o + 1] = first[o] + (long)((outs[o].out + Q8P_PANEL - 1) / Q8P_PANEL) * nb;
    const long items = first[count];
    /* and their 16-column vectors: output o's are [vfirst[o], vfirst[o + 1]) */
    long vfirst[Q8P_MAX_OUTS + 1];
    vfirst[0] = 0;
    for (int o = 0; o < count; o++) vfirst[o + 1] = vfirst[o] + (outs[o].out + 15) / 16;
    /* Decode-sized batches quantize on the calling thread before the one
     * parallel region: a second sync point (the omp for's barrier) costs
     * more than a few rows, and with OMP_WAIT_POLICY=passive each is a
     * futex wake (128 x 896 at n = 1: 0.066 ms against 0.023). */
    const int serial_rows = n <= Q8P_SERIAL_ROWS;
    if (serial_rows)
        for (int i = 0; i < n; i++) sx[i] = q8_quantize_row_u8(q8p_source_row(src, i, in, rows), in, ld, xq + (size_t)i * ld);
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        float *buf = rows + (size_t)t * ld;
        if (!serial_rows) {
#pragma omp for schedule(static)
            for (int i = 0; i < n; i++) sx[i] = q8_quantize_row_u8(q8p_source_row(src, i, in, buf), in, ld, xq + (size_t)i * ld);
        }
        int8_t *pb = panels + (size_t)t * panel_bytes(in);
        int have = -1, have_o = -1;
        if (nb == 1 && serial_rows && vfirst[count] >= 4L * Q8P_NV * nt) {
            /* Decode-sized and memory-bound (>= 4 panels a thread): whole
             * panels, claimed one at a time.  A thread that slept between
             * regions starts tens of microseconds late (a futex wake-up
             * on a virtual machine); with fixed shares its peer then waited
             * as long at the region's end, fell asleep there too, and the
             * next region paid again -- int8 decode 26 -> 22 ms a token on
             * the 0.5B shape when threads never slept.  Claimed panels let
             * the awake thread take what the late one has not started.
             * Every column's arithmetic is the same in either thread. */
#pragma omp for schedule(dynamic, 1) nowait
            for (long it = 0; it < items; it++) { /* one row block: an item is a panel */
                int o = 0;
                while (it >= first[o + 1]) o++;
                const q8p_out *oo = &outs[o];
                const int p = (int)(it - first[o]), left = (oo->out - p * Q8P_PANEL + 15) / 16;
                run_piece(oo, panel_of(oo, o, p, ld, pb, &have, &have_o), NULL, p, 0, left < Q8P_NV ? left : Q8P_NV, xq, sx, ld, 0, n);
            }
        } else if (nb == 1) {
            /* One row block (the mixed serving steps, short prefills):
             * contiguous runs of 16-column vectors per thread, all rows in
             * each -- panels would split a 128-row K or V 2 : 1 and a
             * 896-row one 10 : 9 over two threads */
            const long v0 = vfirst[count] * t / nt, v1 = vfirst[count] * (t + 1) / nt;
            for (int o = 0; o < count; o++) {
                const q8p_out *oo = &outs[o];
                long va = v0 > vfirst[o] ? v0 - vfirst[o] : 0, vb = (v1 < vfirst[o + 1] ? v1 : vfirst[o + 1]) - vfirst[o];
                for (long v = va; v < vb;) {
                    int p = (int)(v / Q8P_NV), voff = (int)(v % Q8P_NV), nv = (int)(vb - v < Q8P_NV - voff ? vb - v : Q8P_NV - voff);
                    run_piece(oo, panel_of(oo, o, p, ld, pb, &have, &have_o), NULL, p, voff, nv, xq, sx, ld, 0, n);
                    v += nv;
                }
            }
        } else {
            /* contiguous items per thread, panel-major: a thread packs each
             * of its panels once (one shared at the boundary is packed by
             * both) */
            long i0 = items * t / nt, i1 = items * (t + 1) / nt;
            int o = 0;
            for (long it = i0; it < i1; it++) {
                while (it >= first[o + 1]) o++;
                const q8p_out *oo = &outs[o];
                const long local = it - first[o];
                int p = (int)(local / nb), blk = (int)(local % nb);
                const int8_t *b = panel_of(oo, o, p, ld, pb, &have, &have_o), *pf = NULL;
                if (cp_q8_layout(oo->w) == CP_Q8_PANELS && it + 1 < i1 && blk == nb - 1 && (p + 1) * Q8P_PANEL < oo->out)
                    pf = b + (size_t)Q8P_PANEL * ld; /* this thread's next item is the next panel (items are panel-major) */
                int r1 = (blk + 1) * ROW_BLOCK < n ? (blk + 1) * ROW_BLOCK : n;
                run_piece(oo, b, pf, p, 0, Q8P_NV, xq, sx, ld, blk * ROW_BLOCK, r1);
            }
        }
    }
}

void q8p_gemm(float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate, void *scratch, int threads)
{
    const q8p_src src = { .kind = Q8P_SRC_PLAIN, .x = x };
    const q8p_out o = { .y = y, .ldy = ldy, .w = w, .out = out, .accumulate = accumulate };
    q8p_run(&src, &o, 1, n, in, scratch, threads);
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

double q8p_peak_ops(int threads, double seconds) { return cpu_peak_rate(peak_loop, threads, seconds, 1 << 18, NULL); }

/* e^x on 16 lanes (cp_exp16: clamped to [-87, 88], relative error ~2e-7),
 * the one copy the CPU kernels share; included here, where its twin was
 * defined, to keep this file's other parts as they are */
#include "exp_avx512.h"

/* out = g / (1 + e^-g) * u over count values, one thread */
__attribute__((target("avx512f"))) void q8p_swiglu_span(float *out, const float *gate, const float *up, size_t count)
{
    for (size_t i = 0; i < count; i += 16) {
        size_t left = count - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        _mm512_mask_storeu_ps(out + i, m, cp_silu_mul16(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i)));
    }
}

/* blocks of 1024 values a work item: every block starts on a multiple of
 * 16, so the lanes are q8p_swiglu_span's over the whole */
void q8p_swiglu(float *out, const float *gate, const float *up, size_t count)
{
    const size_t blocks = (count + 1023) / 1024;
    const long chunk = cpu_claim_sixteenth((long)blocks);
#pragma omp parallel for schedule(dynamic, chunk) if (count > 4096)
    for (size_t b = 0; b < blocks; b++) {
        size_t i = b * 1024, len = count - i < 1024 ? count - i : 1024;
        q8p_swiglu_span(out + i, gate + i, up + i, len);
    }
}

/* 1 / rms of one row: the squares summed in double in 8 lanes (cpu_rmsnorm
 * sums them in double one by one: the factor can differ from its in the
 * last bit of the float), then cpu_rmsnorm's expression x * r * w */
__attribute__((target("avx512f"))) void q8p_rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (int j = 0; j < dim; j += 16) {
        int left = dim - j;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + j);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    const __m512 r = _mm512_set1_ps((float)(1.0 / sqrt(ss / dim + eps)));
    for (int j = 0; j < dim; j += 16) {
        int left = dim - j;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), r), _mm512_maskz_loadu_ps(m, w + j));
        _mm512_mask_storeu_ps(out + j, m, v);
    }
}

void q8p_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
    const long chunk = cpu_claim_sixteenth(n);
#pragma omp parallel for schedule(dynamic, chunk) if (n > 4)
    for (int i = 0; i < n; i++) q8p_rmsnorm_row(out + (size_t)i * dim, x + (size_t)i * dim, w, dim, eps);
}
