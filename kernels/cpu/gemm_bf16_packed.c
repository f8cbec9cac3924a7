/* bf16 compute over packed bf16 weights, vdpbf16ps (gemm_bf16_packed.h
 * says what and why).  Target attributes only: the same binary runs on
 * CPUs without AVX512_BF16, where the backend never calls bf16p_gemm. */
#include "gemm_bf16_packed.h"

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
     * reads its W columns from memory once */
#pragma omp parallel if ((long)out * in > 65536)
    {
#pragma omp for schedule(static)
        for (int i = 0; i < n; i++) round_row(xb + (size_t)i * xs, x + (size_t)i * in, in);
#pragma omp for schedule(static)
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
