/* The exact-f32 dot kernels, written once for every weight type whose
 * elements widen to f32 exactly (f32 itself, bf16): gemm_f32.c and
 * gemm_bf16.c each include this file once, after defining
 *
 *   DOT_W                    the weight element type
 *   DOT_SCALAR(e)            one element as a float
 *   DOT_LOAD8(p)             8 elements as an __m256   (target avx2,fma)
 *   DOT_LOAD16(p)            16 elements as an __m512  (target avx512f,bw,vl)
 *   DOT_LOAD16_TAIL(p, m)    the elements of mask m, zeros elsewhere
 *
 * and get static dot_generic, dot_avx2, hsum4, rows512, block512,
 * avx512_kernels and the driver dot_gemm.  Only the loads differ between
 * the two weight types, so the arithmetic -- and with it batch invariance
 * (every x row runs the same operations whatever the row count) -- is the
 * same code for both. */
#ifndef DOT_W
#error "define DOT_W, DOT_SCALAR, DOT_LOAD8, DOT_LOAD16 and DOT_LOAD16_TAIL before including gemm_dot_impl.h"
#endif

#include <immintrin.h>
#include <stddef.h>

/* ---- dot kernels: r <= 4 rows of x against one row of W ---------------- */

static void dot_generic(const DOT_W *w, const float *x, int ldx, int r, int in, float *acc)
{
    for (int i = 0; i < r; i++) {
        const float *xi = x + (size_t)i * ldx;
        float s = 0;
        for (int k = 0; k < in; k++) s += DOT_SCALAR(w[k]) * xi[k];
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

/* The same operations for every row whatever r is (batch invariance, as
 * rows512 below): two chains over alternate 8-lane steps, joined, one more
 * 8-lane step, hsum8, a scalar tail. */
__attribute__((target("avx2,fma"), always_inline)) static inline void dot_avx2_r(const DOT_W *w, const float *x, int ldx, int r, int in, float *acc)
{
    __m256 a[4], b[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= in; k += 16) {
        __m256 w0 = DOT_LOAD8(w + k), w1 = DOT_LOAD8(w + k + 8);
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) {
            a[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (size_t)i * ldx + k), a[i]);
            b[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + (size_t)i * ldx + k + 8), b[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++) a[i] = _mm256_add_ps(a[i], b[i]);
    if (k + 8 <= in) {
        __m256 wv = DOT_LOAD8(w + k);
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) a[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)i * ldx + k), a[i]);
        k += 8;
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++) {
        float s = hsum8(a[i]);
        for (int kk = k; kk < in; kk++) s += DOT_SCALAR(w[kk]) * x[(size_t)i * ldx + kk];
        acc[i] = s;
    }
}

/* r as a constant in each case: the accumulators stay in registers */
__attribute__((target("avx2,fma"))) static void dot_avx2(const DOT_W *w, const float *x, int ldx, int r, int in, float *acc)
{
    switch (r) {
    case 1: dot_avx2_r(w, x, ldx, 1, in, acc); break;
    case 2: dot_avx2_r(w, x, ldx, 2, in, acc); break;
    case 3: dot_avx2_r(w, x, ldx, 3, in, acc); break;
    default: dot_avx2_r(w, x, ldx, 4, in, acc); break;
    }
}

/* ---- AVX-512: one W row against up to 4 x rows -------------------------
 * The whole column block in one target function (no call through a
 * pointer per W row) and the horizontal sums of 4 x rows in one
 * transposing reduction (hsum4).  One W row at a time, not a register tile
 * of several: W then streams as one sequential read per thread; tiles of
 * 4 W rows x 4 x rows (4 interleaved streams) measured 2.4x slower at one x
 * row and no faster at 16, and 8 x rows a pass no faster than 4: at 16
 * rows this exact-f32 path is bound by the FMAs (16 MACs each), not by W's
 * bytes (docs/RESULTS.md, the decode kernels' row blocking for 2-16 rows).
 * Measured with both kernels in one process, 2 threads: a 4 x 4 tile ran 1
 * row in 0.454 ms against this kernel's 0.241 and 16 rows in 1.31 against
 * 1.17 on 4864 x 896 (gcc folds all 16 x loads into the FMAs); 16 rows
 * run at 61-69 % of a core's FMA peak by CPU time (docs/RESULTS.md, where a
 * decode token's time goes). */

#define A512 "avx512f,avx512bw,avx512vl"
#define RB512 4 /* x rows per pass over a W row */

/* [sum a0, sum a1, sum a2, sum a3] */
__attribute__((target(A512))) static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    __m256 t0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a0), 1)));
    __m256 t1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a1), 1)));
    __m256 t2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a2), 1)));
    __m256 t3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a3), 1)));
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(t0, t1), _mm256_hadd_ps(t2, t3));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* s[i] = x row i . W row for i < R <= RB512 (a constant at every call:
 * the accumulators stay in registers).  Batch invariance: every x row runs
 * the same operations in the same order whatever R is -- two chains over
 * alternate 16-lane steps (two, so that the FMA latency, not the loads,
 * bounds one row), joined, one more 16-lane step, a masked tail, and the
 * same lane reduction (hsum4, zeros in the unused slots) -- so a row's
 * result is bit for bit the same alone, in a batch of 16, or at any place
 * in one (tests/test_bf16.c checks it). */
__attribute__((target(A512), always_inline)) static inline void rows512(const DOT_W *w, int in, const float *x, int ldx, int R,
                                                                          float *s)
{
    __m512 a[RB512], b[RB512];
#pragma GCC unroll 4
    for (int i = 0; i < RB512; i++) a[i] = b[i] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 32 <= in; k += 32) {
        __m512 w0 = DOT_LOAD16(w + k), w1 = DOT_LOAD16(w + k + 16);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            a[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)i * ldx + k), a[i]);
            b[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + (size_t)i * ldx + k + 16), b[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) a[i] = _mm512_add_ps(a[i], b[i]);
    if (k + 16 <= in) {
        __m512 wv = DOT_LOAD16(w + k);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) a[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)i * ldx + k), a[i]);
        k += 16;
    }
    if (k < in) { /* masked tail: no scalar loop */
        __mmask16 m = (__mmask16)((1u << (in - k)) - 1);
        __m512 wv = DOT_LOAD16_TAIL(w + k, m);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) a[i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + (size_t)i * ldx + k), a[i]);
    }
    /* constant indices only, or the accumulators go to the stack; the
     * unused slots are zeros (a[i] for i >= R was never touched) */
    float t[4];
    _mm_storeu_ps(R == 4 ? s : t, hsum4(a[0], a[1], a[2], a[3]));
    if (R < 4)
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) s[i] = t[i];
}

/* output columns j0..j1 of all n rows: x row groups of RB512 over the
 * block, its W rows (16 x in x 2 bytes) staying in cache across the groups */
__attribute__((target(A512))) static void block512(float *y, int ldy, const float *x, const DOT_W *w, int n, int in, int j0, int j1,
                                                   int accumulate)
{
    for (int i0 = 0; i0 < n; i0 += RB512) {
        const int r = n - i0 < RB512 ? n - i0 : RB512;
        const float *xb = x + (size_t)i0 * in;
        for (int j = j0; j < j1; j++) {
            float s[RB512];
            switch (r) { /* r as a constant in each case */
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

/* the ISAs whose f32-compute dot kernels are the AVX-512 ones */
static int avx512_kernels(cpu_isa isa)
{
    return isa == CPU_ISA_AVX512 || isa == CPU_ISA_AMX || isa == CPU_ISA_AVX512_VNNI || isa == CPU_ISA_AVX512_BF16;
}

static void dot_gemm(cpu_isa isa, float *y, int ldy, const float *x, const DOT_W *w, int n, int in, int out, int accumulate)
{
    /* columns in blocks of 16 over the threads, every row group over a
     * block before the next block: W streams from memory once for all n
     * rows (a block's rows, 16 x in weights, stay in L1 / L2), not once per
     * group of 4 */
    const int nblocks = (out + 15) / 16;
    const long chunk = cpu_claim_chunk(nblocks, n, omp_get_max_threads());
    if (avx512_kernels(isa)) {
#pragma omp parallel for schedule(dynamic, chunk) if ((long)out * in > 65536)
        for (int cb = 0; cb < nblocks; cb++)
            block512(y, ldy, x, w, n, in, cb * 16, cb * 16 + 16 < out ? cb * 16 + 16 : out, accumulate);
        return;
    }
    void (*dot)(const DOT_W *, const float *, int, int, int, float *) = isa == CPU_ISA_AVX2 ? dot_avx2 : dot_generic;
#pragma omp parallel for schedule(dynamic, chunk) if ((long)out * in > 65536)
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
