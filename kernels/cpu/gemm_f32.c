/* f32 weights, f32 compute, batch-invariant (gemm_f32.h).  The dot kernels
 * are gemm_bf16.c's, from one source (gemm_dot_impl.h), W read as f32. */
#include "gemm_f32.h"

#include <immintrin.h>
#include <omp.h>
#include <stddef.h>
#include <string.h>

/* ---- dot kernels (gemm_dot_impl.h), W read as f32 ---- */

__attribute__((target("avx2,fma"))) static inline __m256 load8(const float *p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512 load16(const float *p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512 load16_tail(const float *p, __mmask16 m)
{
    return _mm512_maskz_loadu_ps(m, p);
}

#define DOT_W float
#define DOT_SCALAR(e) (e)
#define DOT_LOAD8(p) load8(p)
#define DOT_LOAD16(p) load16(p)
#define DOT_LOAD16_TAIL(p, m) load16_tail(p, m)
#include "gemm_dot_impl.h"

void f32_gemm_dot(cpu_isa isa, float *y, int ldy, const float *x, const float *w, int n, int in, int out, int accumulate)
{
    dot_gemm(isa, y, ldy, x, w, n, in, out, accumulate);
}

/* ---- f32p: packed, register-blocked (gemm_f32.h) ---- */

/* rows of a work item: its W column group (48 columns x in) is read from
 * memory once and from cache for the item's row tiles */
#define FP_ROW_BLOCK 64

int f32p_takes(cpu_isa isa)
{
    return avx512_kernels(isa);
}

static int fp_blocks(int out) { return (out + 15) / 16; }

size_t f32p_bytes(int out, int in) { return (size_t)fp_blocks(out) * (size_t)in * 64; }

/* element (j, k) of W in the packed block: [j / 16][k][j % 16] */
static size_t fp_at(int in, int j, int k) { return ((size_t)(j / 16) * (size_t)in + (size_t)k) * 16 + (size_t)(j % 16); }

void f32p_pack(float *dst, const float *w, int out, int in)
{
    memset(dst, 0, f32p_bytes(out, in)); /* the padding: columns past out */
    for (int j = 0; j < out; j++)
        for (int k = 0; k < in; k++) dst[fp_at(in, j, k)] = w[(size_t)j * in + k];
}

void f32p_unpack(float *dst, const float *src, int out, int in)
{
    for (int j = 0; j < out; j++)
        for (int k = 0; k < in; k++) dst[(size_t)j * in + k] = src[fp_at(in, j, k)];
}

/* R rows of x (row stride ldx) against V packed column blocks starting at
 * w (block stride bs floats): y's columns 0 .. cols (cols > 16 (V - 1)),
 * those past cols masked off.  R and V are constants at every call, so the
 * accumulators stay in registers.  Every output's chain is the same
 * sequence of fmas over k = 0 .. in - 1 whatever R and V are: the tile's
 * shape is speed only. */
__attribute__((target(A512), always_inline)) static inline void fp_tile(int R, int V, float *y, int ldy, const float *x, int ldx,
                                                                          const float *w, size_t bs, int in, int cols, int accumulate)
{
    __m512 acc[F32P_R][F32P_V];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int v = 0; v < V; v++) acc[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < in; k++) {
        __m512 wv[F32P_V];
#pragma GCC unroll 3
        for (int v = 0; v < V; v++) wv[v] = _mm512_load_ps(w + (size_t)v * bs + (size_t)k * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512 xv = _mm512_set1_ps(x[(size_t)r * ldx + k]);
#pragma GCC unroll 3
            for (int v = 0; v < V; v++) acc[r][v] = _mm512_fmadd_ps(wv[v], xv, acc[r][v]);
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

#define FP_TILE_V(R, V) fp_tile(R, V, y, ldy, x, ldx, w, bs, in, cols, accumulate)
#define FP_TILE_R(R)                             \
    case R:                                      \
        if (V == 3) FP_TILE_V(R, 3);             \
        else if (V == 2) FP_TILE_V(R, 2);        \
        else FP_TILE_V(R, 1);                    \
        break;

/* r <= F32P_R rows, V <= F32P_V blocks: the instantiation of that shape */
__attribute__((target(A512))) static void fp_tile_any(int r, int V, float *y, int ldy, const float *x, int ldx, const float *w, size_t bs,
                                                      int in, int cols, int accumulate)
{
    switch (r) {
        FP_TILE_R(1)
        FP_TILE_R(2)
        FP_TILE_R(3)
        FP_TILE_R(4)
        FP_TILE_R(5)
        FP_TILE_R(6)
        FP_TILE_R(7)
    default:
        if (V == 3) FP_TILE_V(8, 3);
        else if (V == 2) FP_TILE_V(8, 2);
        else FP_TILE_V(8, 1);
        break;
    }
}
#undef FP_TILE_R
#undef FP_TILE_V

void f32p_gemm(float *y, int ldy, const float *x, const float *wp, int n, int in, int out, int accumulate)
{
    const int nb = fp_blocks(out), ng = (nb + F32P_V - 1) / F32P_V;
    const int nrb = (n + FP_ROW_BLOCK - 1) / FP_ROW_BLOCK;
    const size_t bs = (size_t)in * 16;
    const long items = (long)ng * nrb;
    /* a thread's chunk of items is a run of column groups (group-major),
     * so each reads its W columns from memory once; claimed one at a time
     * at decode sizes (cpu_claim_chunk) */
    const long chunk = cpu_claim_chunk(items, n, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, chunk) if ((long)out * in > 65536)
    for (long t = 0; t < items; t++) {
        const int g = (int)(t / nrb), rb = (int)(t % nrb);
        const int b0 = g * F32P_V, V = nb - b0 < F32P_V ? nb - b0 : F32P_V, j0 = b0 * 16;
        const int cols = out - j0 < 16 * V ? out - j0 : 16 * V;
        const int i1 = (rb + 1) * FP_ROW_BLOCK < n ? (rb + 1) * FP_ROW_BLOCK : n;
        for (int i0 = rb * FP_ROW_BLOCK; i0 < i1; i0 += F32P_R) {
            const int r = i1 - i0 < F32P_R ? i1 - i0 : F32P_R;
            fp_tile_any(r, V, y + (size_t)i0 * ldy + j0, ldy, x + (size_t)i0 * in, in, wp + (size_t)b0 * bs, bs, in, cols, accumulate);
        }
    }
}
