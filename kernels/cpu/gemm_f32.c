/* f32 weights, f32 compute, batch-invariant (gemm_f32.h).  The kernels are
 * gemm_bf16.c's dot kernels operation for operation, W read as f32. */
#include "gemm_f32.h"

#include <immintrin.h>
#include <omp.h>
#include <stddef.h>
#include <string.h>

static void dot_generic(const float *w, const float *x, int ldx, int r, int in, float *acc)
{
    for (int i = 0; i < r; i++) {
        const float *xi = x + (size_t)i * ldx;
        float s = 0;
        for (int k = 0; k < in; k++) s += w[k] * xi[k];
        acc[i] = s;
    }
}

__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the same operations for every row whatever r is: two chains over
 * alternate 8-lane steps, joined, one more 8-lane step, hsum8, a scalar
 * tail */
__attribute__((target("avx2,fma"), always_inline)) static inline void dot_avx2_r(const float *w, const float *x, int ldx, int r, int in,
                                                                                  float *acc)
{
    __m256 a[4], b[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= in; k += 16) {
        __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) {
            a[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (size_t)i * ldx + k), a[i]);
            b[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + (size_t)i * ldx + k + 8), b[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++) a[i] = _mm256_add_ps(a[i], b[i]);
    if (k + 8 <= in) {
        __m256 wv = _mm256_loadu_ps(w + k);
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) a[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)i * ldx + k), a[i]);
        k += 8;
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++) {
        float s = hsum8(a[i]);
        for (int kk = k; kk < in; kk++) s += w[kk] * x[(size_t)i * ldx + kk];
        acc[i] = s;
    }
}

__attribute__((target("avx2,fma"))) static void dot_avx2(const float *w, const float *x, int ldx, int r, int in, float *acc)
{
    switch (r) { /* r as a constant in each case: the accumulators stay in registers */
    case 1: dot_avx2_r(w, x, ldx, 1, in, acc); break;
    case 2: dot_avx2_r(w, x, ldx, 2, in, acc); break;
    case 3: dot_avx2_r(w, x, ldx, 3, in, acc); break;
    default: dot_avx2_r(w, x, ldx, 4, in, acc); break;
    }
}

#define A512 "avx512f,avx512bw,avx512vl"
#define RB512 4

__attribute__((target(A512))) static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    __m256 t0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a0), 1)));
    __m256 t1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a1), 1)));
    __m256 t2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a2), 1)));
    __m256 t3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a3), 1)));
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(t0, t1), _mm256_hadd_ps(t2, t3));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* s[i] = x row i . W row for i < R <= RB512: two chains over alternate
 * 16-lane steps, joined, one more 16-lane step, a masked tail, hsum4 --
 * the same for every row whatever R */
__attribute__((target(A512), always_inline)) static inline void rows512(const float *w, int in, const float *x, int ldx, int R, float *s)
{
    __m512 a[RB512], b[RB512];
#pragma GCC unroll 4
    for (int i = 0; i < RB512; i++) a[i] = b[i] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 32 <= in; k += 32) {
        __m512 w0 = _mm512_loadu_ps(w + k), w1 = _mm512_loadu_ps(w + k + 16);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            a[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)i * ldx + k), a[i]);
            b[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + (size_t)i * ldx + k + 16), b[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) a[i] = _mm512_add_ps(a[i], b[i]);
    if (k + 16 <= in) {
        __m512 wv = _mm512_loadu_ps(w + k);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) a[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)i * ldx + k), a[i]);
        k += 16;
    }
    if (k < in) {
        __mmask16 m = (__mmask16)((1u << (in - k)) - 1);
        __m512 wv = _mm512_maskz_loadu_ps(m, w + k);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) a[i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + (size_t)i * ldx + k), a[i]);
    }
    float t[4];
    _mm_storeu_ps(R == 4 ? s : t, hsum4(a[0], a[1], a[2], a[3]));
    if (R < 4)
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) s[i] = t[i];
}

/* output columns j0..j1 of all n rows, x row groups of RB512 over the
 * block while its W rows stay in cache */
__attribute__((target(A512))) static void block512(float *y, int ldy, const float *x, const float *w, int n, int in, int j0, int j1,
                                                   int accumulate)
{
    for (int i0 = 0; i0 < n; i0 += RB512) {
        const int r = n - i0 < RB512 ? n - i0 : RB512;
        const float *xb = x + (size_t)i0 * in;
        for (int j = j0; j < j1; j++) {
            float s[RB512];
            switch (r) {
            case 1: rows512(w + (size_t)j * in, in, xb, in, 1, s); break;
            case 2: rows512(w + (size_t)j * in, in, xb, in, 2, s); break;
            case 3: rows512(w + (size_t)j * in, in, xb, in, 3, s); break;
            default: rows512(w + (size_t)j * in, in, xb, in, 4, s); break;
            }
            for (int i = 0; i < r; i++) {
                float *yo = y + (size_t)(i0 + i) * ldy + j;
                *yo = accumulate ? *yo + s[i] : s[i];
            }
        }
    }
}

void f32_gemm_dot(cpu_isa isa, float *y, int ldy, const float *x, const float *w, int n, int in, int out, int accumulate)
{
    const int nblocks = (out + 15) / 16;
    if (isa == CPU_ISA_AVX512 || isa == CPU_ISA_AMX || isa == CPU_ISA_AVX512_VNNI || isa == CPU_ISA_AVX512_BF16) {
#pragma omp parallel for schedule(static) if ((long)out * in > 65536)
        for (int cb = 0; cb < nblocks; cb++)
            block512(y, ldy, x, w, n, in, cb * 16, cb * 16 + 16 < out ? cb * 16 + 16 : out, accumulate);
        return;
    }
    void (*dot)(const float *, const float *, int, int, int, float *) = isa == CPU_ISA_AVX2 ? dot_avx2 : dot_generic;
#pragma omp parallel for schedule(static) if ((long)out * in > 65536)
    for (int cb = 0; cb < nblocks; cb++) {
        int j0 = cb * 16, j1 = j0 + 16 < out ? j0 + 16 : out;
        for (int i0 = 0; i0 < n; i0 += 4) {
            int r = n - i0 < 4 ? n - i0 : 4;
            const float *xb = x + (size_t)i0 * in;
            for (int j = j0; j < j1; j++) {
                float acc[4];
                dot(w + (size_t)j * in, xb, in, r, in, acc);
                for (int i = 0; i < r; i++) {
                    float *yo = y + (size_t)(i0 + i) * ldy + j;
                    *yo = accumulate ? *yo + acc[i] : acc[i];
                }
            }
        }
    }
}

/* ---- f32p: packed, register-blocked (gemm_f32.h) ---- */

/* rows of a work item: its W column group (48 columns x in) is read from
 * memory once and from cache for the item's row tiles */
#define FP_ROW_BLOCK 64

int f32p_takes(cpu_isa isa)
{
    return isa == CPU_ISA_AVX512 || isa == CPU_ISA_AMX || isa == CPU_ISA_AVX512_VNNI || isa == CPU_ISA_AVX512_BF16;
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
     * so each reads its W columns from memory once */
#pragma omp parallel for schedule(static) if ((long)out * in > 65536)
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
