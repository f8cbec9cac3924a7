/* bf16 compute over packed bf16 weights, vdpbf16ps (gemm_bf16_packed.h
 * says what and why).  Target attributes only: the same binary runs on
 * CPUs without AVX512_BF16, where the backend never calls bf16p_gemm. */
#include "gemm_bf16_packed.h"
#include "gemm_bf16.h"

#include <immintrin.h>
#include <omp.h>
#include <string.h>

#define BP_TARGET "avx512f,avx512bw,avx512vl,avx512bf16"
/* rows of a work item: its W column group (<= 48 columns x in, L2-sized)
 * is read from memory once and from cache for the item's row tiles */
#define BP_ROW_BLOCK 64

static int pairs(int in) { return (in + 1) / 2; }
static int blocks(int out) { return (out + 15) / 16; }
/* x row stride in bf16 elements: a multiple of 16 (whole 32-byte stores) */
static int x_ld(int in) { return (in + 15) & ~15; }

size_t bf16p_bytes(int out, int in) { return (size_t)blocks(out) * (size_t)pairs(in) * 64; }

size_t bf16p_scratch(int n, int in) { return (size_t)n * (size_t)x_ld(in) * 2; }

/* element (j, k) of W in the packed block: [j / 16][k / 2][j % 16][k % 2] */
static size_t packed_at(int kp, int j, int k)
{
    return ((size_t)(j / 16) * (size_t)kp + (size_t)(k / 2)) * 32 + (size_t)(j % 16) * 2 + (size_t)(k % 2);
}

void bf16p_pack(void *dst, const uint16_t *w, int out, int in)
{
    uint16_t *d = dst;
    const int kp = pairs(in);
    memset(d, 0, bf16p_bytes(out, in)); /* the padding: columns past out, the odd input's partner */
    for (int j = 0; j < out; j++)
        for (int k = 0; k < in; k++) d[packed_at(kp, j, k)] = w[(size_t)j * in + k];
}

void bf16p_unpack(uint16_t *dst, const void *src, int out, int in)
{
    const uint16_t *s = src;
    const int kp = pairs(in);
    for (int j = 0; j < out; j++)
        for (int k = 0; k < in; k++) dst[(size_t)j * in + k] = s[packed_at(kp, j, k)];
}

void bf16p_rows(float *dst, const void *src, const int32_t *ids, int n, int out, int in)
{
    const uint16_t *s = src;
    const int kp = pairs(in);
    (void)out;
    for (int i = 0; i < n; i++) {
        float *o = dst + (size_t)i * in;
        for (int k = 0; k < in; k++) {
            const uint32_t u = (uint32_t)s[packed_at(kp, ids[i], k)] << 16; /* bf16 -> f32: exact */
            memcpy(&o[k], &u, 4);
        }
    }
}

/* one x row rounded to bf16 (nearest even), zero-padded to x_ld(in) */
__attribute__((target(BP_TARGET))) static void round_row(uint16_t *dst, const float *x, int in)
{
    const int ld = x_ld(in);
    for (int k = 0; k < ld; k += 16) {
        const int left = in - k;
        const __mmask16 m = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k));
        _mm256_storeu_si256((__m256i *)(void *)(dst + k), (__m256i)h);
    }
}

/* R rows of rounded x (row stride xs32 pairs) against V packed column
 * blocks starting at w (block stride bs elements): y's columns 0 .. cols
 * (cols > 16 (V - 1)), those past cols masked off.  R and V are constants
 * at every call, so the accumulators stay in registers.  Every output's
 * chain is the same sequence of vdpbf16ps over p = 0 .. kp - 1 whatever R
 * and V are: the tile's shape is speed only. */
__attribute__((target(BP_TARGET), always_inline)) static inline void tile(int R, int V, float *y, int ldy, const uint32_t *x, int xs32,
                                                                            const uint16_t *w, size_t bs, int kp, int cols,
                                                                            int accumulate)
{
    __m512 acc[BF16P_R][BF16P_V];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int v = 0; v < V; v++) acc[r][v] = _mm512_setzero_ps();
    for (int p = 0; p < kp; p++) {
        __m512bh wv[BF16P_V];
#pragma GCC unroll 3
        for (int v = 0; v < V; v++) wv[v] = (__m512bh)_mm512_load_si512(w + (size_t)v * bs + (size_t)p * 32);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)x[(size_t)r * xs32 + p]);
#pragma GCC unroll 3
            for (int v = 0; v < V; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], wv[v], xv);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int v = 0; v < V; v++) {
            const int left = cols - 16 * v;
            const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            float *yo = y + (size_t)r * ldy + 16 * v;
            const __m512 o = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), acc[r][v]) : acc[r][v];
            _mm512_mask_storeu_ps(yo, m, o);
        }
}

#define TILE_V(R, V) tile(R, V, y, ldy, x, xs32, w, bs, kp, cols, accumulate)
#define TILE_R(R)                                \
    case R:                                      \
        if (V == 3) TILE_V(R, 3);                \
        else if (V == 2) TILE_V(R, 2);           \
        else TILE_V(R, 1);                       \
        break;

/* r <= BF16P_R rows, V <= BF16P_V blocks: the instantiation of that shape */
__attribute__((target(BP_TARGET))) static void tile_any(int r, int V, float *y, int ldy, const uint32_t *x, int xs32, const uint16_t *w,
                                                         size_t bs, int kp, int cols, int accumulate)
{
    switch (r) {
        TILE_R(1)
        TILE_R(2)
        TILE_R(3)
        TILE_R(4)
        TILE_R(5)
        TILE_R(6)
        TILE_R(7)
    default:
        if (V == 3) TILE_V(8, 3);
        else if (V == 2) TILE_V(8, 2);
        else TILE_V(8, 1);
        break;
    }
}
#undef TILE_R
#undef TILE_V

/* 16 x 16 dwords transposed in registers: r[c] holds row c's dwords
 * 0..15 on entry, dword e of every row on return (unpack 32, unpack 64,
 * then two 128-bit lane shuffles; as gemm_i8_prefill.c's) */
__attribute__((target(BP_TARGET), always_inline)) static inline void transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; m++) {
        __m512i s0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), s1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xee);
        __m512i s2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44), s3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xee);
        r[m] = _mm512_shuffle_i32x4(s0, s2, 0x88);
        r[4 + m] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
        r[8 + m] = _mm512_shuffle_i32x4(s1, s3, 0x88);
        r[12 + m] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
    }
}

/* x's pairs with the rows in the lanes: pair p of rows 16g .. 16g + 15 is
 * the vector at xt + (g kp + p) 16 dwords (rows past n zero) */
static size_t xt_bytes(int n, int in) { return (size_t)((n + 15) / 16) * (size_t)pairs(in) * 64; }

size_t bf16p_plain_scratch(int n, int in) { return ((bf16p_scratch(n, in) + 63) & ~(size_t)63) + xt_bytes(n, in); }

/* W pair p of a plain row (2 bf16 as one dword); the odd input's last
 * pair has a zero partner, as the packed layout's padding */
static inline int w_pair(const uint16_t *row, int in, int p)
{
    const uint32_t lo = row[2 * p], hi = 2 * p + 1 < in ? row[2 * p + 1] : 0;
    return (int)(lo | hi << 16);
}

/* 16 W rows (j0 .. j0 + 16, those past out left alone) against the x
 * rows of group g: lanes are rows, so output (i, j)'s chain is
 * acc = dp(acc, x[i][pair p], W[j][pair p]) over p in order from 0 --
 * each lane's sum of two exact products is the packed kernel's (the
 * operands swap sides, the products are the same) -- then a 16 x 16
 * transpose gives y's rows */
__attribute__((target(BP_TARGET))) static void lanes16(float *y, int ldy, const uint32_t *xt, const uint16_t *w, int in, int kp, int j0,
                                                        int out, int rows, int accumulate)
{
    __m512 acc[16];
    const uint16_t *wr[16];
    const int cols = out - j0 < 16 ? out - j0 : 16;
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) acc[c] = _mm512_setzero_ps(), wr[c] = w + (size_t)(j0 + (c < cols ? c : 0)) * in;
    const int kfull = in / 2; /* pairs with both inputs in the row */
    for (int p = 0; p < kfull; p++) {
        if ((p & 15) == 0) /* 16 row streams: more than the hardware prefetcher follows; a line (16 pairs) 4 lines ahead */
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) _mm_prefetch((const char *)(wr[c] + 2 * p) + 256, _MM_HINT_T0);
        const __m512bh xv = (__m512bh)_mm512_load_si512(xt + (size_t)p * 16);
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) {
            uint32_t wv;
            memcpy(&wv, wr[c] + 2 * p, 4);
            acc[c] = _mm512_dpbf16_ps(acc[c], xv, (__m512bh)_mm512_set1_epi32((int)wv));
        }
    }
    if (kfull < kp) { /* in odd: the last input with a zero partner */
        const __m512bh xv = (__m512bh)_mm512_load_si512(xt + (size_t)kfull * 16);
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) acc[c] = _mm512_dpbf16_ps(acc[c], xv, (__m512bh)_mm512_set1_epi32(w_pair(wr[c], in, kfull)));
    }
    __m512i r[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) r[c] = _mm512_castps_si512(acc[c]);
    transpose16(r); /* r[l]: row l's 16 columns */
    const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    for (int l = 0; l < rows; l++) {
        float *yo = y + (size_t)l * ldy + j0;
        const __m512 v = _mm512_castsi512_ps(r[l]);
        _mm512_mask_storeu_ps(yo, m, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, yo), v) : v);
    }
}

void bf16p_gemm_plain(float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out, int accumulate, void *scratch)
{
    uint16_t *xb = scratch;
    uint32_t *xt = (uint32_t *)(void *)((char *)scratch + ((bf16p_scratch(n, in) + 63) & ~(size_t)63));
    const int kp = pairs(in), xs = x_ld(in), ng = (n + 15) / 16, nb = blocks(out);
#pragma omp parallel if ((long)out * in > 65536)
    {
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++) round_row(xb + (size_t)i * xs, x + (size_t)i * in, in);
#pragma omp for schedule(static)
        for (int g = 0; g < ng; g++) /* rows to lanes: a dword (pair) at a time */
            for (int p = 0; p < kp; p++)
                for (int l = 0; l < 16; l++) {
                    const int i = 16 * g + l;
                    uint32_t v = 0;
                    if (i < n) memcpy(&v, xb + (size_t)i * xs + 2 * p, 4);
                    xt[((size_t)g * kp + p) * 16 + l] = v;
                }
#pragma omp for schedule(static)
        for (int b = 0; b < nb; b++) /* a block's 16 W rows stay in cache across the row groups */
            for (int g = 0; g < ng; g++) {
                const int rows = n - 16 * g < 16 ? n - 16 * g : 16;
                lanes16(y + (size_t)16 * g * ldy, ldy, xt + (size_t)g * kp * 16, w, in, kp, 16 * b, out, rows, accumulate);
            }
    }
}

void bf16p_gemm(float *y, int ldy, const float *x, const void *wp, int n, int in, int out, int accumulate, void *scratch)
{
    uint16_t *xb = scratch;
    const uint16_t *w = wp;
    const int kp = pairs(in), xs = x_ld(in), nb = blocks(out), ng = (nb + BF16P_V - 1) / BF16P_V;
    const int nrb = (n + BP_ROW_BLOCK - 1) / BP_ROW_BLOCK;
    const size_t bs = (size_t)kp * 32;
    const long items = (long)ng * nrb;
    /* one parallel region for the rounding and the tiles: a thread's
     * chunk of items is a run of column groups (group-major), so each
     * reads its W columns from memory once.  At decode sizes the rows are
     * rounded before the region (no barrier to wait at for a late thread)
     * and the items claimed one at a time (cpu_claim_chunk). */
    const int claim = n <= CPU_CLAIM_ROWS;
    const long chunk = cpu_claim_chunk(items, n, omp_get_max_threads());
    if (claim)
        for (int i = 0; i < n; i++) round_row(xb + (size_t)i * xs, x + (size_t)i * in, in);
#pragma omp parallel if ((long)out * in > 65536)
    {
        if (!claim) {
#pragma omp for schedule(static)
            for (int i = 0; i < n; i++) round_row(xb + (size_t)i * xs, x + (size_t)i * in, in);
        }
#pragma omp for schedule(dynamic, chunk)
        for (long t = 0; t < items; t++) {
            const int g = (int)(t / nrb), rb = (int)(t % nrb);
            const int b0 = g * BF16P_V, V = nb - b0 < BF16P_V ? nb - b0 : BF16P_V, j0 = b0 * 16;
            const int cols = out - j0 < 16 * V ? out - j0 : 16 * V;
            const int i1 = (rb + 1) * BP_ROW_BLOCK < n ? (rb + 1) * BP_ROW_BLOCK : n;
            for (int i0 = rb * BP_ROW_BLOCK; i0 < i1; i0 += BF16P_R) {
                const int r = i1 - i0 < BF16P_R ? i1 - i0 : BF16P_R;
                tile_any(r, V, y + (size_t)i0 * ldy + j0, ldy, (const uint32_t *)(const void *)(xb + (size_t)i0 * xs), xs / 2,
                         w + (size_t)b0 * bs, bs, kp, cols, accumulate);
            }
        }
    }
}
