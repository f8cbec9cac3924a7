/* int8 GEMMs (gemm_i8.h).  Why integer dot products for decode: a decode
 * step is bound by the bytes of W streamed, and int8 halves bf16's; the
 * integer kernels consume 64 (VNNI) or 32 / 16 weights per instruction
 * without widening them to f32 first. */
#include "gemm_i8.h"

#include <math.h>
#include <omp.h>
#include <string.h>
#include <immintrin.h>

#include "../q8.h"

const char *q8_isa_name(q8_isa k)
{
    switch (k) {
    case Q8_AVX2: return "avx2";
    case Q8_AVX512: return "avx512";
    case Q8_VNNI: return "avx512vnni";
    default: return "generic";
    }
}

q8_isa q8_isa_for(cpu_isa isa, int forced, const cpu_features *f)
{
    if (forced) {
        switch (isa) {
        case CPU_ISA_GENERIC: return Q8_GENERIC;
        case CPU_ISA_AVX2: return Q8_AVX2;
        case CPU_ISA_AVX512: return Q8_AVX512;
        case CPU_ISA_AVX512_VNNI: return Q8_VNNI;
        default: break; /* amx: the widest */
        }
    }
    return f->avx512_vnni ? Q8_VNNI : f->avx512 ? Q8_AVX512 : f->avx2_fma ? Q8_AVX2 : Q8_GENERIC;
}

/* ---- activations: one scale per row ----------------------------------- */

/* Scratch layout: n floats of scales (padded to 64 bytes), then n rows of
 * ld elements: u8 (x + 128) for vnni, s16 for avx512 / avx2, s8 for
 * generic -- 2 bytes per element reserved for all. */
size_t q8_scratch(int n, int in)
{
    if (n > Q8_ROW_CHUNK) n = Q8_ROW_CHUNK;
    return cp_q8_round64((size_t)n * 4) + (size_t)n * (size_t)cp_q8_ld(in) * 2;
}

/* Returns the row's scale; NaN when the row holds a NaN or an Inf (its
 * outputs are then NaN, as f32 compute would give, not garbage). */
static float quantize_act(q8_isa k, const float *x, int in, int ld, void *dst)
{
    float mx = 0;
    int bad = 0;
    for (int i = 0; i < in; i++) {
        float a = fabsf(x[i]);
        bad |= !(a <= 3.4e38f);
        mx = a > mx ? a : mx;
    }
    float inv = mx > 0 && !bad ? 127.0f / mx : 0.0f;
    for (int i = 0; i < ld; i++) {
        /* a bad row quantizes to zeros (NaN * 0 is NaN: never cast to int) */
        float v = i < in && !bad ? nearbyintf(x[i] * inv) : 0.0f;
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        int q = (int)v;
        if (k == Q8_VNNI) ((uint8_t *)dst)[i] = (uint8_t)(q + 128);
        else if (k == Q8_GENERIC) ((int8_t *)dst)[i] = (int8_t)q;
        else ((int16_t *)dst)[i] = (int16_t)q;
    }
    return bad ? NAN : mx / 127.0f;
}

/* quantize_act for the VNNI kernel, 16 lanes at a time: the same integers
 * (the same max, the same f32 product, round to nearest even as nearbyintf
 * in the default rounding mode, the same clamp), so the paths still agree
 * exactly.  Why: the scalar loop ran before every GEMM's parallel region,
 * on one thread -- per decode token ~270 k activations, a few % of an int8
 * token's time. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static float quantize_act_u8(const float *x, int in, int ld, uint8_t *dst)
{
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff); /* integer AND: _mm512_and_ps is AVX512DQ */
    const __m512 big = _mm512_set1_ps(3.4e38f);
    __m512 mxv = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int i = 0; i < in; i += 16) {
        __mmask16 m = in - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (in - i)) - 1);
        __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + i)), absmask));
        bad |= _mm512_mask_cmp_ps_mask(m, a, big, _CMP_NLE_UQ); /* !(a <= 3.4e38): NaN and Inf */
        mxv = _mm512_max_ps(mxv, a);
    }
    float mx = _mm512_reduce_max_ps(mxv);
    float inv = mx > 0 && !bad ? 127.0f / mx : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i off = _mm512_set1_epi32(128);
    for (int i = 0; i < ld; i += 16) {
        /* a bad row quantizes to zeros (NaN * 0 is NaN: never converted) */
        __mmask16 m = bad ? 0 : in - i >= 16 ? (__mmask16)0xffff : in > i ? (__mmask16)((1u << (in - i)) - 1) : 0;
        __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(v), off);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm512_cvtepi32_epi8(q));
    }
    const float scale = mx / 127.0f;
    return bad ? NAN : scale;
}

float q8_quantize_row_u8(const float *x, int in, int ld, uint8_t *dst) { return quantize_act_u8(x, in, ld, dst); }

/* ---- dot kernels: r <= 4 rows of quantized x against one row of W ------
 * ld is a multiple of 64; xs is the row stride of x in elements */

static void dot_generic(const int8_t *w, const void *x, int xs, int r, int ld, int32_t *acc)
{
    for (int i = 0; i < r; i++) {
        const int8_t *xi = (const int8_t *)x + (size_t)i * xs;
        int32_t s = 0;
        for (int k = 0; k < ld; k++) s += (int32_t)w[k] * xi[k];
        acc[i] = s;
    }
}

__attribute__((target("avx2,fma"))) static inline int32_t hsum8_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

__attribute__((target("avx2,fma"), always_inline)) static inline void dot_avx2_r(const int8_t *w, const void *x, int xs, int r, int ld, int32_t *acc)
{
    const int16_t *x16 = x;
    __m256i a[4] = { _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256() };
    for (int k = 0; k < ld; k += 32) {
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(const void *)(w + k)));
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(const void *)(w + k + 16)));
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) {
            const int16_t *xi = x16 + (size_t)i * xs + k;
            __m256i p0 = _mm256_madd_epi16(w0, _mm256_load_si256((const __m256i *)(const void *)xi));
            __m256i p1 = _mm256_madd_epi16(w1, _mm256_load_si256((const __m256i *)(const void *)(xi + 16)));
            a[i] = _mm256_add_epi32(a[i], _mm256_add_epi32(p0, p1));
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++) acc[i] = hsum8_epi32(a[i]);
}

/* r as a constant in each case: the accumulators stay in registers */
__attribute__((target("avx2,fma"))) static void dot_avx2(const int8_t *w, const void *x, int xs, int r, int ld, int32_t *acc)
{
    switch (r) {
    case 1: dot_avx2_r(w, x, xs, 1, ld, acc); break;
    case 2: dot_avx2_r(w, x, xs, 2, ld, acc); break;
    case 3: dot_avx2_r(w, x, xs, 3, ld, acc); break;
    default: dot_avx2_r(w, x, xs, 4, ld, acc); break;
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline void dot_avx512_r(const int8_t *w, const void *x, int xs, int r, int ld, int32_t *acc)
{
    const int16_t *x16 = x;
    __m512i a[4] = { _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512() };
    for (int k = 0; k < ld; k += 64) {
        __m512i w0 = _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)(const void *)(w + k)));
        __m512i w1 = _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)(const void *)(w + k + 32)));
#pragma GCC unroll 4
        for (int i = 0; i < r; i++) {
            const int16_t *xi = x16 + (size_t)i * xs + k;
            __m512i p0 = _mm512_madd_epi16(w0, _mm512_load_si512(xi));
            __m512i p1 = _mm512_madd_epi16(w1, _mm512_load_si512(xi + 32));
            a[i] = _mm512_add_epi32(a[i], _mm512_add_epi32(p0, p1));
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < r; i++) acc[i] = _mm512_reduce_add_epi32(a[i]);
}

/* r as a constant in each case: the accumulators stay in registers */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void dot_avx512(const int8_t *w, const void *x, int xs, int r, int ld, int32_t *acc)
{
    switch (r) {
    case 1: dot_avx512_r(w, x, xs, 1, ld, acc); break;
    case 2: dot_avx512_r(w, x, xs, 2, ld, acc); break;
    case 3: dot_avx512_r(w, x, xs, 3, ld, acc); break;
    default: dot_avx512_r(w, x, xs, 4, ld, acc); break;
    }
}

#define VNNI_TARGET "avx512f,avx512bw,avx512vl,avx512vnni"

/* [sum a0, sum a1, sum a2, sum a3]: one transposing reduction for 4 rows */
__attribute__((target(VNNI_TARGET))) static inline __m128i hsum4_epi32(__m512i a0, __m512i a1, __m512i a2, __m512i a3)
{
    __m256i t0 = _mm256_add_epi32(_mm512_castsi512_si256(a0), _mm512_extracti64x4_epi64(a0, 1));
    __m256i t1 = _mm256_add_epi32(_mm512_castsi512_si256(a1), _mm512_extracti64x4_epi64(a1, 1));
    __m256i t2 = _mm256_add_epi32(_mm512_castsi512_si256(a2), _mm512_extracti64x4_epi64(a2, 1));
    __m256i t3 = _mm256_add_epi32(_mm512_castsi512_si256(a3), _mm512_extracti64x4_epi64(a3, 1));
    __m256i u = _mm256_hadd_epi32(_mm256_hadd_epi32(t0, t1), _mm256_hadd_epi32(t2, t3));
    return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

/* x is u8 (x + 128): acc comes out as dot + 128 * rowsum, taken back by the
 * caller.  Up to Q8_VNNI_ROWS rows of x per W row: each W vector loaded
 * feeds r vpdpbusd, r independent chains, and the horizontal sums go four
 * rows at a time (hsum4_epi32); constant indices only, or the accumulators
 * go to the stack. */
__attribute__((target(VNNI_TARGET), always_inline)) static inline void dot_vnni_r(const int8_t *w, const void *x, int xs, int r, int ld, int32_t *acc)
{
    const uint8_t *xu = x;
    __m512i a[Q8_VNNI_ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < Q8_VNNI_ROWS; i++) a[i] = _mm512_setzero_si512();
    int k = 0;
    if (r == 1) { /* two chains: vpdpbusd's latency, not the loads, bounds one */
        __m512i b = _mm512_setzero_si512();
        for (; k + 128 <= ld; k += 128) {
            a[0] = _mm512_dpbusd_epi32(a[0], _mm512_load_si512(xu + k), _mm512_load_si512(w + k));
            b = _mm512_dpbusd_epi32(b, _mm512_load_si512(xu + k + 64), _mm512_load_si512(w + k + 64));
        }
        a[0] = _mm512_add_epi32(a[0], b);
    }
    for (; k < ld; k += 64) {
        __m512i wv = _mm512_load_si512(w + k);
#pragma GCC unroll 8
        for (int i = 0; i < r; i++) a[i] = _mm512_dpbusd_epi32(a[i], _mm512_load_si512(xu + (size_t)i * xs + k), wv);
    }
    if (r >= 4) _mm_storeu_si128((__m128i *)(void *)acc, hsum4_epi32(a[0], a[1], a[2], a[3]));
    if (r >= 8) _mm_storeu_si128((__m128i *)(void *)(acc + 4), hsum4_epi32(a[4], a[5], a[6], a[7]));
#pragma GCC unroll 8
    for (int i = r / 4 * 4; i < r; i++) acc[i] = _mm512_reduce_add_epi32(a[i]);
}

/* r as a constant in each case: the accumulators stay in registers */
#define VNNI_CASE(R) \
    case R: dot_vnni_r(w, x, xs, R, ld, acc); break;
__attribute__((target(VNNI_TARGET))) static void dot_vnni(const int8_t *w, const void *x, int xs, int r, int ld, int32_t *acc)
{
    switch (r) {
    VNNI_CASE(1) VNNI_CASE(2) VNNI_CASE(3) VNNI_CASE(4) VNNI_CASE(5) VNNI_CASE(6) VNNI_CASE(7)
    default: dot_vnni_r(w, x, xs, 8, ld, acc); break;
    }
}
#undef VNNI_CASE

/* one chunk of at most Q8_ROW_CHUNK rows */
static void q8_gemm_rows(q8_isa k, float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate,
                         void *scratch)
{
    const int ld = cp_q8_ld(in);
    float *sx = scratch;
    char *xq = (char *)scratch + cp_q8_round64((size_t)n * 4);
    const size_t row_bytes = (size_t)ld * 2; /* reserved per row; xs below is in elements */
    const int xs = k == Q8_AVX2 || k == Q8_AVX512 ? ld : ld * 2;
    for (int i = 0; i < n; i++)
        sx[i] = k == Q8_VNNI ? quantize_act_u8(x + (size_t)i * in, in, ld, (uint8_t *)xq + (size_t)i * row_bytes)
                             : quantize_act(k, x + (size_t)i * in, in, ld, xq + (size_t)i * row_bytes);
    void (*dot)(const int8_t *, const void *, int, int, int, int32_t *) =
        k == Q8_VNNI ? dot_vnni : k == Q8_AVX512 ? dot_avx512 : k == Q8_AVX2 ? dot_avx2 : dot_generic;
    const int8_t *q = cp_q8_data(w);
    const float *sw = cp_q8_scales(w);
    const int32_t *sum = cp_q8_sums(w);
    const int32_t bias = k == Q8_VNNI ? 128 : 0;
    const int nblocks = (out + Q8_COL_BLOCK - 1) / Q8_COL_BLOCK;
    /* rows per dot call: the others take at most 4; vnni 8 while 8 rows of
     * x and a W row stay in L1 (at in = 4864, 8 rows measured 1.4x slower
     * than 4 at n = 8) */
    const int rg = k == Q8_VNNI && (size_t)ld * Q8_VNNI_ROWS <= 24576 ? Q8_VNNI_ROWS : 4;
    const long chunk = cpu_claim_chunk(nblocks, n, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, chunk) if ((long)out * in > 65536)
    for (int b = 0; b < nblocks; b++) {
        int j0 = b * Q8_COL_BLOCK, j1 = j0 + Q8_COL_BLOCK < out ? j0 + Q8_COL_BLOCK : out;
        for (int i0 = 0; i0 < n; i0 += rg) { /* the block's W rows stay in cache across row groups */
            int r = n - i0 < rg ? n - i0 : rg;
            for (int j = j0; j < j1; j++) {
                int32_t acc[Q8_VNNI_ROWS];
                dot(q + (size_t)j * ld, xq + (size_t)i0 * row_bytes, xs, r, ld, acc);
                for (int i = 0; i < r; i++) {
                    float v = (float)(acc[i] - bias * sum[j]) * (sx[i0 + i] * sw[j]);
                    float *yo = y + (size_t)(i0 + i) * ldy + j;
                    *yo = accumulate ? *yo + v : v;
                }
            }
        }
    }
}

void q8_gemm(q8_isa k, float *y, int ldy, const float *x, const void *w, int n, int in, int out, int accumulate, void *scratch)
{
    /* chunks of rows: a chunk's quantized x (<= 64 x ld x 2 bytes) stays
     * in L2 while every column block runs over it */
    for (int i0 = 0; i0 < n; i0 += Q8_ROW_CHUNK) {
        int r = n - i0 < Q8_ROW_CHUNK ? n - i0 : Q8_ROW_CHUNK;
        q8_gemm_rows(k, y + (size_t)i0 * ldy, ldy, x + (size_t)i0 * in, w, r, in, out, accumulate, scratch);
    }
}

void q8_embed(float *out, const void *table, const int32_t *ids, int n, int dim)
{
    for (int i = 0; i < n; i++) cp_q8_dequant_row(table, ids[i], out + (size_t)i * dim);
}
